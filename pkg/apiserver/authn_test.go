package apiserver

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"

	"github.com/kubefill/kubefill/pkg/pki"
)

type ca struct {
	*pki.CA
	pem string
}

func newCA(t *testing.T, cn string) *ca {
	t.Helper()
	c, err := pki.NewCA(cn, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &ca{CA: c, pem: string(c.CertPEM)}
}

func (c *ca) issue(t *testing.T, cn string, usage x509.ExtKeyUsage, orgs ...string) *x509.Certificate {
	t.Helper()
	certPEM, _, err := c.IssueWith(pki.LeafOptions{CommonName: cn, Organizations: orgs, Usages: []x509.ExtKeyUsage{usage}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(certPEM)
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

func authConfigMap(clientCA, rhCA *ca, allowed string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: AuthConfigMapName}, Data: map[string]string{
		"requestheader-allowed-names":        allowed,
		"requestheader-username-headers":     `["X-Remote-User"]`,
		"requestheader-group-headers":        `["X-Remote-Group"]`,
		"requestheader-extra-headers-prefix": `["X-Remote-Extra-"]`,
	}}
	if clientCA != nil {
		cm.Data["client-ca-file"] = clientCA.pem
	}
	if rhCA != nil {
		cm.Data["requestheader-client-ca-file"] = rhCA.pem
	}
	return cm
}

func TestParseAuthConfigMap(t *testing.T) {
	clientCA, rhCA := newCA(t, "client-ca"), newCA(t, "front-proxy-ca")
	cfg, err := ParseAuthConfigMap(authConfigMap(clientCA, rhCA, `["front-proxy-client"]`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClientCA == nil || cfg.RequestHeaderCA == nil || cfg.AllowedNames[0] != "front-proxy-client" || cfg.UsernameHeaders[0] != "X-Remote-User" {
		t.Fatalf("%+v", cfg)
	}
	bad := []struct {
		name string
		edit func(*corev1.ConfigMap)
	}{
		{"allowed names not JSON", func(c *corev1.ConfigMap) { c.Data["requestheader-allowed-names"] = "front-proxy-client" }},
		{"CA not PEM", func(c *corev1.ConfigMap) { c.Data["client-ca-file"] = "junk" }},
		{"request-header CA without username headers", func(c *corev1.ConfigMap) { delete(c.Data, "requestheader-username-headers") }},
	}
	for _, b := range bad {
		cm := authConfigMap(clientCA, rhCA, `[]`)
		b.edit(cm)
		if _, err := ParseAuthConfigMap(cm); err == nil {
			t.Errorf("%s: accepted", b.name)
		}
	}
}

func TestAuthenticate(t *testing.T) {
	clientCA, rhCA, other := newCA(t, "client-ca"), newCA(t, "front-proxy-ca"), newCA(t, "other")
	strict, err := ParseAuthConfigMap(authConfigMap(clientCA, rhCA, `["front-proxy-client"]`))
	if err != nil {
		t.Fatal(err)
	}
	anyName, err := ParseAuthConfigMap(authConfigMap(clientCA, rhCA, `[]`))
	if err != nil {
		t.Fatal(err)
	}
	req := func(certs ...*x509.Certificate) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		if certs != nil {
			r.TLS = &tls.ConnectionState{PeerCertificates: certs}
		}
		r.Header.Set("X-Remote-User", "alice")
		r.Header.Add("X-Remote-Group", "g1")
		r.Header.Add("X-Remote-Group", "g2")
		r.Header.Set("X-Remote-Extra-Acme.com%2Fproject", "p1")
		return r
	}
	proxy := rhCA.issue(t, "front-proxy-client", x509.ExtKeyUsageClientAuth)
	cases := []struct {
		name     string
		cfg      *AuthConfig
		r        *http.Request
		wantUser string
	}{
		{"front proxy", strict, req(proxy), "alice"},
		{"front proxy, any CN allowed", anyName, req(rhCA.issue(t, "whatever", x509.ExtKeyUsageClientAuth)), "alice"},
		{"front proxy CN not allowed", strict, req(rhCA.issue(t, "whatever", x509.ExtKeyUsageClientAuth)), ""},
		{"front proxy serverAuth only", strict, req(rhCA.issue(t, "front-proxy-client", x509.ExtKeyUsageServerAuth)), ""},
		{"client CA user, headers ignored", strict, req(clientCA.issue(t, "bob", x509.ExtKeyUsageClientAuth, "devs")), "bob"},
		{"unknown CA", strict, req(other.issue(t, "front-proxy-client", x509.ExtKeyUsageClientAuth)), ""},
		{"no certificate", strict, req(), ""},
		{"no configuration", nil, req(proxy), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, err := tc.cfg.Authenticate(tc.r)
			if tc.wantUser == "" {
				if err == nil || !errors.Is(err, ErrUnauthenticated) {
					t.Fatalf("want ErrUnauthenticated, got user %+v err %v", u, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if u.Name != tc.wantUser {
				t.Fatalf("user %q, want %q", u.Name, tc.wantUser)
			}
		})
	}
	u, _ := strict.Authenticate(req(proxy))
	if strings.Join(u.Groups, ",") != "g1,g2" || u.Extra["acme.com/project"][0] != "p1" {
		t.Fatalf("groups/extra from headers: %+v", u)
	}
	u, _ = strict.Authenticate(req(clientCA.issue(t, "bob", x509.ExtKeyUsageClientAuth, "devs")))
	if len(u.Groups) != 1 || u.Groups[0] != "devs" {
		t.Fatalf("client-CA groups: %+v", u)
	}
}

func TestUploadTargetError(t *testing.T) {
	group := cdiv1.GroupName
	pvc := func(ann map[string]string, ref *corev1.TypedObjectReference) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Annotations: ann}, Spec: corev1.PersistentVolumeClaimSpec{DataSourceRef: ref}}
	}
	now := metav1.Now()
	deleting := pvc(map[string]string{cdiv1.AnnUploadRequest: ""}, nil)
	deleting.DeletionTimestamp = &now
	cases := []struct {
		name string
		pvc  *corev1.PersistentVolumeClaim
		want string
	}{
		{"annotated", pvc(map[string]string{cdiv1.AnnUploadRequest: ""}, nil), ""},
		{"populator", pvc(nil, &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeUploadSource", Name: "u"}), ""},
		{"import populator", pvc(nil, &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeImportSource", Name: "u"}), "not an upload target"},
		{"plain", pvc(nil, nil), "not an upload target"},
		{"done", pvc(map[string]string{cdiv1.AnnUploadRequest: "", cdiv1.AnnPodPhase: "Succeeded"}, nil), "already received"},
		{"populated", pvc(map[string]string{cdiv1.AnnPopulatedFor: "p"}, &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeUploadSource", Name: "u"}), "already received"},
		{"deleting", deleting, "being deleted"},
	}
	for _, tc := range cases {
		err := UploadTargetError(tc.pvc)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestCheckUploadTokenRequest(t *testing.T) {
	ok := uploadv1.UploadTokenRequest{Spec: uploadv1.UploadTokenRequestSpec{PvcName: "disk"}}
	if msg := checkUploadTokenRequest(&ok, "ns"); msg != "" {
		t.Fatal(msg)
	}
	for name, edit := range map[string]func(*uploadv1.UploadTokenRequest){
		"no pvc":        func(u *uploadv1.UploadTokenRequest) { u.Spec.PvcName = "" },
		"bad pvc name":  func(u *uploadv1.UploadTokenRequest) { u.Spec.PvcName = "Disk_1" },
		"other ns":      func(u *uploadv1.UploadTokenRequest) { u.Namespace = "other" },
		"wrong kind":    func(u *uploadv1.UploadTokenRequest) { u.Kind = "Secret" },
		"wrong version": func(u *uploadv1.UploadTokenRequest) { u.APIVersion = "upload.cdi.kubevirt.io/v1alpha1" },
	} {
		u := ok
		edit(&u)
		if checkUploadTokenRequest(&u, "ns") == "" {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestTLSConfigRequestsClientCerts: the TLS layer asks for client
// certificates without verifying them (Authenticate does, per request).
func TestTLSConfigRequestsClientCerts(t *testing.T) {
	cfg, err := TLSConfig(Options{GeneratedHosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClientAuth != tls.RequestClientCert || cfg.MinVersion != tls.VersionTLS12 || len(cfg.Certificates) != 1 {
		t.Fatalf("clientAuth %v, min %x, %d certificates", cfg.ClientAuth, cfg.MinVersion, len(cfg.Certificates))
	}
	leaf, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
	if err != nil || leaf.Subject.CommonName != "kubefill-apiserver" {
		t.Fatalf("generated certificate %v: %v", leaf, err)
	}
}
