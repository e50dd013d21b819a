package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
	"github.com/kubefill/kubefill/tests/internal/registry"
	"github.com/kubefill/kubefill/tests/kit"
)

// TestImportThroughInterceptingProxy (C4): with CDIConfig's importProxy
// naming a TLS-intercepting proxy and its CA (trustedCAProxy, a ConfigMap
// of the install namespace), a DataVolume imports from a registry only the
// proxy reaches: the importer pod trusts the certificate the proxy
// presents for the registry. Serial: every importer started meanwhile
// would go through the proxy.
func TestImportThroughInterceptingProxy(t *testing.T) {
	s := shared
	c := s.c
	ctx := context.Background()
	gw, err := cl.GatewayAddress()
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.Start(t, registry.Options{TLS: true})
	disk, sha := goldenDisk(12)
	reg.PushDisk(t, "containerdisks/proxied:1", disk)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(reg.CAPEM) {
		t.Fatal("the registry's CA is no PEM")
	}
	const host = "registry.kubefill-proxied.test"
	upstream := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	proxy := testimg.StartInterceptingProxy(t, gw, host, upstream, reg.Host)

	caName := "import-proxy-ca-" + randomSuffix()
	if err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.installNS, Name: caName}, Data: map[string]string{"ca.crt": string(proxy.CAPEM)}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.installNS, Name: caName}})
	})
	want := &cdiv1.ImportProxy{HTTPSProxy: ptr.To(proxy.URL), TrustedCAProxy: ptr.To(caName)}
	var old *cdiv1.ImportProxy
	editConfigSpec(t, c, "importProxy to name the intercepting proxy", func(spec *cdiv1.CDIConfigSpec) bool {
		if equality.Semantic.DeepEqual(spec.ImportProxy, want) {
			return true
		}
		old, spec.ImportProxy = spec.ImportProxy.DeepCopy(), want.DeepCopy()
		return false
	})
	t.Cleanup(func() {
		editConfigSpec(t, c, "importProxy put back", func(spec *cdiv1.CDIConfigSpec) bool {
			if !equality.Semantic.DeepEqual(spec.ImportProxy, want) {
				return true
			}
			spec.ImportProxy = old.DeepCopy()
			return false
		})
		waitProxyStatus(t, "CDIConfig's status to drop the proxy's CA", func(p *cdiv1.ImportProxy) bool { return ptr.Deref(p.TrustedCAProxy, "") != caName })
	})
	waitProxyStatus(t, "CDIConfig's status to name the proxy and its CA", func(p *cdiv1.ImportProxy) bool {
		return ptr.Deref(p.TrustedCAProxy, "") == caName && ptr.Deref(p.HTTPSProxy, "") == proxy.URL
	})

	ns := newNamespace(t)
	dv := kit.DataVolume(ns, "proxied", &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To("docker://" + host + "/containerdisks/proxied:1")}},
		kit.WithPVC(filesystemClaim("64Mi")))
	if err := c.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	got, _ := kit.WaitDataVolumeTerminal(t, c, ns, dv.Name, 5*time.Minute)
	if got.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("ended %s: %+v\nevents:\n%s", got.Status.Phase, got.Status.Conditions, eventsFor(ns, dv.Name))
	}
	if n := proxy.Tunnels.Load(); n == 0 {
		t.Error("the import did not go through the proxy")
	}
	if sum := claimSHA256(t, ns, dv.Name, int64(len(disk))); sum != sha {
		t.Errorf("the claim holds sha256 %s, the image is %s", sum, sha)
	}
}

// waitProxyStatus waits until CDIConfig's status.importProxy satisfies ok.
func waitProxyStatus(t *testing.T, what string, ok func(*cdiv1.ImportProxy) bool) {
	t.Helper()
	kit.Eventually(t, time.Minute, kit.Interval, what, func() (bool, string, error) {
		config := &cdiv1.CDIConfig{}
		if err := shared.c.Get(context.Background(), types.NamespacedName{Name: cdiv1.CDIConfigName}, config); err != nil {
			return false, "", err
		}
		p := config.Status.ImportProxy
		if p == nil {
			p = &cdiv1.ImportProxy{}
		}
		return ok(p), fmt.Sprintf("status.importProxy %+v", p), nil
	})
}
