package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubefill/kubefill/pkg/apiserver"
	"github.com/kubefill/kubefill/tests/kit"
)

// The authenticator follows its ConfigMap as it changes: a new allowed-names
// list, a new front-proxy CA, and deletion all take effect without a restart.
// The ConfigMap lives in a test namespace so that kube-apiserver's own
// controller, which owns kube-system/extension-apiserver-authentication, does
// not rewrite it under the test.
func TestAPIServerFollowsAuthenticationConfigMap(t *testing.T) {
	ns := newNamespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ca1, ca2 := kit.TestCA(t, "front-proxy-ca-1"), kit.TestCA(t, "front-proxy-ca-2")
	proxy1, _, _ := ca1.ClientCert(t, frontProxyName)
	proxy2, _, _ := ca2.ClientCert(t, frontProxyName)

	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: apiserver.AuthConfigMapName},
		Data: map[string]string{
			"requestheader-client-ca-file":       string(ca1.CertPEM),
			"requestheader-allowed-names":        `["front-proxy-client"]`,
			"requestheader-username-headers":     `["X-Remote-User"]`,
			"requestheader-group-headers":        `["X-Remote-Group"]`,
			"requestheader-extra-headers-prefix": `["X-Remote-Extra-"]`,
		},
	}
	if err := k8sClient.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	src := &apiserver.AuthSource{}
	if err := apiserver.WatchAuthConfigMap(ctx, kube, ns, apiserver.AuthConfigMapName, src, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	request := func(cert tls.Certificate) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}
		r.Header.Set("X-Remote-User", "alice")
		r.Header.Add("X-Remote-Group", "team-a")
		r.Header.Set("X-Remote-Extra-Scopes%2Fread", "yes")
		return r
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		took := kit.Eventually(t, 10*time.Second, 20*time.Millisecond, what, func() (bool, string, error) { return ok(), "", nil })
		t.Logf("%s: observed after %s", what, took.Round(time.Microsecond))
	}
	authOK := func(cert tls.Certificate) bool {
		_, err := src.Authenticate(request(cert))
		return err == nil
	}

	u, err := src.Authenticate(request(proxy1))
	if err != nil {
		t.Fatalf("initial configuration: %v", err)
	}
	if u.Name != "alice" || len(u.Groups) != 1 || u.Groups[0] != "team-a" || u.Extra["scopes/read"][0] != "yes" {
		t.Fatalf("user %+v", u)
	}
	if authOK(proxy2) {
		t.Fatal("a certificate from the second CA is trusted before the change")
	}

	update := func(f func(*corev1.ConfigMap)) {
		t.Helper()
		if err := k8sClient.Get(ctx, clientKey(cm), cm); err != nil {
			t.Fatal(err)
		}
		f(cm)
		if err := k8sClient.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	update(func(c *corev1.ConfigMap) { c.Data["requestheader-allowed-names"] = `["someone-else"]` })
	eventually("allowed names narrowed", func() bool { return !authOK(proxy1) })

	update(func(c *corev1.ConfigMap) {
		c.Data["requestheader-allowed-names"] = `["front-proxy-client"]`
		c.Data["requestheader-client-ca-file"] = string(ca2.CertPEM)
	})
	eventually("front-proxy CA replaced", func() bool { return authOK(proxy2) && !authOK(proxy1) })

	// A broken update is ignored: the last good configuration stays.
	update(func(c *corev1.ConfigMap) { c.Data["requestheader-allowed-names"] = `not json` })
	time.Sleep(300 * time.Millisecond)
	if !authOK(proxy2) {
		t.Fatal("an unparsable ConfigMap replaced the working configuration")
	}

	if err := k8sClient.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually("ConfigMap deleted", func() bool {
		_, err := src.Authenticate(request(proxy2))
		return errors.Is(err, apiserver.ErrUnauthenticated)
	})
}

func clientKey(o metav1.Object) types.NamespacedName {
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}
}
