package certs

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/pki"
)

func mustCA(t *testing.T, name string, validity time.Duration) (*pki.CA, *x509.Certificate) {
	t.Helper()
	ca, err := pki.NewCA(name, validity)
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseCert(ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	return ca, c
}

func mustLeaf(t *testing.T, ca *pki.CA, hosts []string, validity time.Duration) *x509.Certificate {
	t.Helper()
	crt, _, err := ca.Issue("leaf", hosts, false, validity)
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseCert(crt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDecide(t *testing.T) {
	def := DefaultSettings()
	caCfg, leafCfg := def.CA, def.Server
	ca, caCert := mustCA(t, "ca", caCfg.Lifetime.Duration)
	otherCA, otherCert := mustCA(t, "other", caCfg.Lifetime.Duration)
	hosts := []string{"kubefill-api", "kubefill-api.ns", "kubefill-api.ns.svc"}
	leafCert := mustLeaf(t, ca, hosts, leafCfg.Lifetime.Duration)
	foreignLeaf := mustLeaf(t, otherCA, hosts, leafCfg.Lifetime.Duration)
	caAnn, leafAnn := caCfg.Annotation(), leafCfg.Annotation()
	// Times relative to each certificate's expiry.
	caSoon := caCert.NotAfter.Add(-caCfg.RenewBefore() - time.Minute) // a minute before due
	caDue := caCert.NotAfter.Add(-caCfg.RenewBefore() + time.Second)
	leafSoon := leafCert.NotAfter.Add(-leafCfg.RenewBefore() - time.Minute)

	tests := []struct {
		name      string
		now       time.Time
		have      Have
		want      Want
		renew     bool
		reason    string
		refreshAt time.Time
	}{
		{"missing", caSoon, Have{}, Want{Config: caCfg}, true, "missing", time.Time{}},
		{"fresh CA", caSoon, Have{Cert: caCert, Config: caAnn}, Want{Config: caCfg}, false, "", caCert.NotAfter.Add(-24 * time.Hour)},
		{"CA due for refresh", caDue, Have{Cert: caCert, Config: caAnn}, Want{Config: caCfg}, true, "due for refresh", time.Time{}},
		{"CA expired", caCert.NotAfter, Have{Cert: caCert, Config: caAnn}, Want{Config: caCfg}, true, "expired", time.Time{}},
		{"config annotation missing", caSoon, Have{Cert: caCert}, Want{Config: caCfg}, true, "config changed", time.Time{}},
		{"config changed", caSoon, Have{Cert: caCert, Config: caAnn}, Want{Config: lifetime(time.Hour, 30*time.Minute)}, true, "config changed", time.Time{}},
		{"fresh leaf", leafSoon, Have{Cert: leafCert, Config: leafAnn}, Want{Config: leafCfg, Signer: caCert, Hosts: hosts}, false, "", leafCert.NotAfter.Add(-12 * time.Hour)},
		{"leaf hosts in another order", leafSoon, Have{Cert: leafCert, Config: leafAnn}, Want{Config: leafCfg, Signer: caCert, Hosts: []string{hosts[2], hosts[0], hosts[1], hosts[0]}}, false, "", leafCert.NotAfter.Add(-12 * time.Hour)},
		{"leaf due", leafCert.NotAfter.Add(-12 * time.Hour), Have{Cert: leafCert, Config: leafAnn}, Want{Config: leafCfg, Signer: caCert, Hosts: hosts}, true, "due for refresh", time.Time{}},
		{"signer rotated", leafSoon, Have{Cert: leafCert, Config: leafAnn}, Want{Config: leafCfg, Signer: otherCert, Hosts: hosts}, true, "not signed by the current signer", time.Time{}},
		{"leaf of another CA", leafSoon, Have{Cert: foreignLeaf, Config: leafAnn}, Want{Config: leafCfg, Signer: caCert, Hosts: hosts}, true, "not signed by the current signer", time.Time{}},
		{"hostname added", leafSoon, Have{Cert: leafCert, Config: leafAnn}, Want{Config: leafCfg, Signer: caCert, Hosts: append(hosts, "10.0.0.7")}, true, "hostnames differ", time.Time{}},
		{"client leaf ignores hosts", leafSoon, Have{Cert: leafCert, Config: leafAnn}, Want{Config: leafCfg, Signer: caCert}, false, "", leafCert.NotAfter.Add(-12 * time.Hour)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.now, tt.have, tt.want)
			if d.Renew != tt.renew || !strings.Contains(d.Reason, tt.reason) || !d.RefreshAt.Equal(tt.refreshAt) {
				t.Errorf("Decide = %+v, want renew %v, reason containing %q, refreshAt %s", d, tt.renew, tt.reason, tt.refreshAt)
			}
		})
	}
}

func TestKeepInBundle(t *testing.T) {
	_, a := mustCA(t, "a", 2*time.Hour)
	_, b := mustCA(t, "b", 4*time.Hour)
	_, c := mustCA(t, "c", 6*time.Hour)
	names := func(cs []*x509.Certificate) string {
		var n []string
		for _, c := range cs {
			n = append(n, c.Subject.CommonName)
		}
		return strings.Join(n, ",")
	}
	now := time.Now()
	tests := []struct {
		name    string
		now     time.Time
		current *x509.Certificate
		bundle  []*x509.Certificate
		want    string
	}{
		{"first", now, a, nil, "a"},
		{"rotated keeps the old one", now, b, []*x509.Certificate{a}, "b,a"},
		{"twice keeps both", now, c, []*x509.Certificate{b, a}, "c,b,a"},
		{"current already in it", now, b, []*x509.Certificate{b, a}, "b,a"},
		{"expired CA dropped", a.NotAfter, c, []*x509.Certificate{b, a}, "c,b"},
		{"duplicates once", now, c, []*x509.Certificate{a, a, c}, "c,a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := names(KeepInBundle(tt.now, tt.current, tt.bundle)); got != tt.want {
				t.Errorf("KeepInBundle = %s, want %s", got, tt.want)
			}
		})
	}
	// The bundle survives its PEM round trip.
	if got := names(parseBundle(encodeBundle([]*x509.Certificate{c, b}))); got != "c,b" {
		t.Errorf("bundle round trip = %s", got)
	}
}

func TestSettingsFrom(t *testing.T) {
	d := func(s string) *metav1.Duration {
		v, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		return &metav1.Duration{Duration: v}
	}
	def := DefaultSettings()
	tests := []struct {
		name     string
		cc       *cdiv1.CDICertConfig
		want     Settings
		problems int
	}{
		{"nil is CDI's defaults", nil, def, 0},
		{"HCO's values", &cdiv1.CDICertConfig{CA: &cdiv1.CertConfig{Duration: d("48h"), RenewBefore: d("24h")}, Server: &cdiv1.CertConfig{Duration: d("24h"), RenewBefore: d("12h")}}, def, 0},
		{"short durations", &cdiv1.CDICertConfig{
			CA:     &cdiv1.CertConfig{Duration: d("2m"), RenewBefore: d("1m")},
			Server: &cdiv1.CertConfig{Duration: d("40s"), RenewBefore: d("20s")},
			Client: &cdiv1.CertConfig{Duration: d("30s"), RenewBefore: d("10s")}},
			Settings{CA: lifetime(2*time.Minute, time.Minute), Server: lifetime(40*time.Second, 20*time.Second), Client: lifetime(30*time.Second, 20*time.Second)}, 0},
		{"duration alone renews halfway", &cdiv1.CDICertConfig{CA: &cdiv1.CertConfig{Duration: d("10m")}},
			Settings{CA: lifetime(10*time.Minute, 5*time.Minute), Server: def.Server, Client: def.Client}, 0},
		{"renewBefore alone", &cdiv1.CDICertConfig{Server: &cdiv1.CertConfig{RenewBefore: d("6h")}},
			Settings{CA: def.CA, Server: lifetime(24*time.Hour, 18*time.Hour), Client: def.Client}, 0},
		{"renewBefore not shorter than duration", &cdiv1.CDICertConfig{CA: &cdiv1.CertConfig{Duration: d("1h"), RenewBefore: d("1h")}}, def, 1},
		{"negative duration", &cdiv1.CDICertConfig{Client: &cdiv1.CertConfig{Duration: d("-1h")}}, def, 1},
		{"empty parts", &cdiv1.CDICertConfig{CA: &cdiv1.CertConfig{}}, def, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, problems := SettingsFrom(tt.cc)
			if got != tt.want || len(problems) != tt.problems {
				t.Errorf("SettingsFrom = %+v %q, want %+v with %d problems", got, problems, tt.want, tt.problems)
			}
		})
	}
	if a := lifetime(48*time.Hour, 24*time.Hour).Annotation(); a != `{"lifetime":"48h0m0s","refresh":"24h0m0s"}` {
		t.Errorf("annotation = %s, want CDI's form", a)
	}
}
