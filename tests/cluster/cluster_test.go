package cluster

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubefill/kubefill/pkg/apiserver"
	"github.com/kubefill/kubefill/tests/kit"
)

// TestControlPlaneStartStop starts the control plane alone, checks the parts
// that the rest of the harness relies on, and checks that Stop leaves no
// process or directory behind.
func TestControlPlaneStartStop(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root like the rest of the local cluster")
	}
	start := time.Now()
	c, err := Start(context.Background(), Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane up in %s", time.Since(start).Round(time.Millisecond))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop()
		}
	})
	ctx := context.Background()

	v, err := c.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != "v1.37.2" {
		t.Errorf("server version %q, want v1.37.2", v.GitVersion)
	}
	// kube-controller-manager publishes the cluster CA (it was given
	// --root-ca-file) into every namespace.
	cm := kit.Await(t, 30*time.Second, kit.Interval, "kube-root-ca.crt to appear",
		func() (*corev1.ConfigMap, error) {
			return c.Client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		}, func(*corev1.ConfigMap) bool { return true }, nil)
	if !strings.Contains(cm.Data["ca.crt"], "BEGIN CERTIFICATE") {
		t.Fatalf("kube-root-ca.crt holds no CA: %q", cm.Data["ca.crt"])
	}
	// The aggregation layer's client CA is published for extension servers.
	auth, err := c.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if auth.Data["requestheader-client-ca-file"] == "" {
		t.Error("extension-apiserver-authentication has no requestheader CA")
	}
	// The certificate kube-apiserver presents to Kubefill's webhooks
	// (--admission-control-config-file) is one `kubefill apiserver
	// --webhook-client-names=WebhookClientName` admits, by the CAs kube-apiserver publishes.
	authCfg, err := apiserver.ParseAuthConfigMap(auth)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := os.ReadFile(filepath.Join(c.Dir, "pki", "apiserver-webhook-client.crt"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(certPEM)
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := authCfg.WebhookCaller([]*x509.Certificate{leaf}, []string{WebhookClientName}); err != nil {
		t.Errorf("kube-apiserver's webhook client certificate: %v", err)
	}
	admissionCfg, err := os.ReadFile(filepath.Join(c.Dir, "pki", "admission-config.yaml"))
	if err != nil || !strings.Contains(string(admissionCfg), "WebhookAdmissionConfiguration") {
		t.Errorf("admission configuration %q: %v", admissionCfg, err)
	}

	st, err := LoadState(c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Processes) != 4 {
		t.Fatalf("state lists %d processes, want etcd, kube-apiserver, kube-controller-manager, kube-scheduler", len(st.Processes))
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	for _, p := range st.Processes {
		if p.alive() {
			t.Errorf("%s (pid %d) still runs after Stop", p.Name, p.PID)
		}
	}
	if _, err := os.Stat(filepath.Join(c.Dir, stateFile)); !os.IsNotExist(err) {
		t.Errorf("cluster dir %s still exists after Stop", c.Dir)
	}
}
