package kit

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// recorder is a testing.TB whose Fatal only records the message.
type recorder struct {
	testing.TB
	fatal string
}

func (r *recorder) Helper()           {}
func (r *recorder) Fatal(args ...any) { r.fatal = fmt.Sprint(args...) }

func TestTerminal(t *testing.T) {
	for phase, want := range map[cdiv1.DataVolumePhase]bool{
		cdiv1.Succeeded: true, cdiv1.Failed: true, cdiv1.ImportInProgress: false, cdiv1.UploadReady: false, "": false,
	} {
		if Terminal(phase) != want {
			t.Errorf("Terminal(%q) = %v", phase, !want)
		}
	}
	for phase, want := range map[corev1.PodPhase]bool{
		corev1.PodSucceeded: true, corev1.PodFailed: true, corev1.PodRunning: false, corev1.PodPending: false,
	} {
		if Terminal(phase) != want {
			t.Errorf("Terminal(%q) = %v", phase, !want)
		}
	}
}

func TestEventually(t *testing.T) {
	calls := 0
	r := &recorder{TB: t}
	Eventually(r, time.Second, time.Millisecond, "three calls", func() (bool, string, error) {
		calls++
		return calls == 3, "", errors.New("not yet")
	})
	if r.fatal != "" || calls != 3 {
		t.Errorf("after %d calls: fatal %q", calls, r.fatal)
	}

	r = &recorder{TB: t}
	Eventually(r, 20*time.Millisecond, time.Millisecond, "the impossible", func() (bool, string, error) {
		return false, "still impossible", errors.New("boom")
	})
	for _, want := range []string{"timed out after 20ms waiting for the impossible", "last status: still impossible", "last error: boom"} {
		if !strings.Contains(r.fatal, want) {
			t.Errorf("failure %q lacks %q", r.fatal, want)
		}
	}
}

func TestAwaitDescribesTheLastValue(t *testing.T) {
	r := &recorder{TB: t}
	n := 0
	got := Await(r, 20*time.Millisecond, time.Millisecond, "n to reach 1000",
		func() (int, error) { n++; return n, nil },
		func(v int) bool { return v >= 1000 },
		func(v int) string { return fmt.Sprintf("n is %d", v) })
	if got != n || !strings.Contains(r.fatal, fmt.Sprintf("n is %d", n)) {
		t.Errorf("got %d, n %d, failure %q", got, n, r.fatal)
	}
}

func TestBuilders(t *testing.T) {
	p := PVC("ns", "disk", "1Gi", Class("fast"), Mode(corev1.PersistentVolumeBlock), SourceRef(cdiv1.VolumeImportSourceRef, "src"), Annotate(map[string]string{"a": "b"}))
	q := p.Spec.Resources.Requests[corev1.ResourceStorage]
	if p.Namespace != "ns" || p.Name != "disk" || q.String() != "1Gi" || *p.Spec.StorageClassName != "fast" ||
		*p.Spec.VolumeMode != corev1.PersistentVolumeBlock || p.Spec.AccessModes[0] != corev1.ReadWriteOnce ||
		*p.Spec.DataSourceRef.APIGroup != cdiv1.GroupName || p.Spec.DataSourceRef.Kind != cdiv1.VolumeImportSourceRef || p.Annotations["a"] != "b" {
		t.Errorf("PVC: %+v", p)
	}
	if PVC("", "x", "1Gi", Annotate(nil)).Annotations != nil {
		t.Error("no annotations made a map")
	}
	dv := DataVolume("ns", "dv", HTTP("http://x/disk.img"), WithStorage("", "2Gi"))
	if dv.Spec.Source.HTTP.URL != "http://x/disk.img" || dv.Spec.Storage.StorageClassName != nil || dv.Spec.PVC != nil {
		t.Errorf("DataVolume: %+v", dv.Spec)
	}
	if dv := DataVolume("ns", "up", Upload(), WithPVC(ClaimSpec("1Gi"))); dv.Spec.Source.Upload == nil || dv.Spec.PVC == nil {
		t.Errorf("upload DataVolume: %+v", dv.Spec)
	}
}

func TestCAIssuesGroupsAndBothUsages(t *testing.T) {
	ca := TestCA(t, "test-ca")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM)
	for _, l := range []Leaf{
		{CommonName: "admin", Organization: []string{"system:masters"}, Client: true},
		{CommonName: "both", Hosts: []string{"localhost", "127.0.0.1"}, Server: true, Client: true},
		{CommonName: "server", Hosts: []string{"svc.ns.svc"}, Server: true},
	} {
		certPEM, _, err := ca.Issue(l)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pem.Decode(certPEM)
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		var usages []x509.ExtKeyUsage
		if l.Server {
			usages = append(usages, x509.ExtKeyUsageServerAuth)
		}
		if l.Client {
			usages = append(usages, x509.ExtKeyUsageClientAuth)
		}
		for _, u := range usages {
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
				t.Errorf("%s for usage %v: %v", l.CommonName, u, err)
			}
		}
		if strings.Join(cert.Subject.Organization, ",") != strings.Join(l.Organization, ",") {
			t.Errorf("%s: organisations %v, want %v", l.CommonName, cert.Subject.Organization, l.Organization)
		}
		if len(cert.DNSNames)+len(cert.IPAddresses) != len(l.Hosts) {
			t.Errorf("%s: SANs %v %v, want %v", l.CommonName, cert.DNSNames, cert.IPAddresses, l.Hosts)
		}
	}
}
