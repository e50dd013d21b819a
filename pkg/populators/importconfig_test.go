package populators

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

func TestInsecureRegistry(t *testing.T) {
	listed := []string{"registry.a.svc:5000", "mirror.example.com", "https://secure.example.com"}
	cases := []struct {
		endpoint string
		list     []string
		want     bool
	}{
		{"docker://registry.a.svc:5000/os/fedora:40", listed, true},
		{"docker://mirror.example.com/os/fedora@sha256:00", listed, true},
		// CDI compares host[:port] exactly: no port implied, no scheme stripped.
		{"docker://registry.a.svc/os/fedora:40", listed, false},
		{"docker://mirror.example.com:443/os/fedora:40", listed, false},
		{"docker://secure.example.com/os/fedora:40", listed, false},
		// Only registry (docker://) sources.
		{"https://mirror.example.com/disk.img", listed, false},
		{"oci-archive:///images/disk.tar", []string{""}, false},
		{"docker://registry.a.svc:5000/os/fedora:40", nil, false},
		{"docker://%zz/bad", listed, false},
	}
	for _, c := range cases {
		config := &cdiv1.CDIConfig{Spec: cdiv1.CDIConfigSpec{InsecureRegistries: c.list}}
		if got := InsecureRegistry(c.endpoint, config); got != c.want {
			t.Errorf("InsecureRegistry(%q, %v) = %v, want %v", c.endpoint, c.list, got, c.want)
		}
	}
	if InsecureRegistry("docker://registry.a.svc:5000/x", nil) {
		t.Error("a missing CDIConfig lists a registry")
	}
}

func TestTrustedCAProxy(t *testing.T) {
	for _, c := range []struct {
		name   string
		config *cdiv1.CDIConfig
		want   string
	}{
		{"no CDIConfig", nil, ""},
		{"no import proxy", &cdiv1.CDIConfig{}, ""},
		{"empty", &cdiv1.CDIConfig{Status: cdiv1.CDIConfigStatus{ImportProxy: &cdiv1.ImportProxy{TrustedCAProxy: ptr.To("")}}}, ""},
		// CDI reads the status, which the CDIConfig controller fills from the spec.
		{"only in the spec", &cdiv1.CDIConfig{Spec: cdiv1.CDIConfigSpec{ImportProxy: &cdiv1.ImportProxy{TrustedCAProxy: ptr.To("ca")}}}, ""},
		{"named", &cdiv1.CDIConfig{Status: cdiv1.CDIConfigStatus{ImportProxy: &cdiv1.ImportProxy{TrustedCAProxy: ptr.To("ca")}}}, "ca"},
	} {
		if got := TrustedCAProxy(c.config); got != c.want {
			t.Errorf("%s: TrustedCAProxy = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestProxyCABundle(t *testing.T) {
	for _, c := range []struct {
		name string
		cm   corev1.ConfigMap
		want string
	}{
		{"empty", corev1.ConfigMap{}, ""},
		{"ca.crt", corev1.ConfigMap{Data: map[string]string{"ca.crt": "A\n"}}, "A\n"},
		{"every key, in order, each ending a line", corev1.ConfigMap{Data: map[string]string{"z.pem": "Z", "ca.crt": "A\n"},
			BinaryData: map[string][]byte{"m.der": []byte("M")}}, "A\nM\nZ\n"},
		{"data wins over binaryData of the same key", corev1.ConfigMap{Data: map[string]string{"ca.crt": "A"},
			BinaryData: map[string][]byte{"ca.crt": []byte("B")}}, "A\n"},
	} {
		if got := string(ProxyCABundle(&c.cm)); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// importFlow is a registry import of url into a 1Gi claim of namespace ns.
func importFlow(ns, url string) *Flow {
	target := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "disk", UID: "0a1b2c3d-0000-4000-8000-000000000001"}}
	prime := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prime-0a1b2c3d-0000-4000-8000-000000000001",
		Annotations: map[string]string{cdiv1.AnnContentType: "kubevirt"}},
		Spec: corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	src := &cdiv1.VolumeImportSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "src"},
		Spec: cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To(url)}}}}
	return &Flow{Target: target, Prime: prime, Source: src}
}

// The importer of a registry CDIConfig lists as insecure gets INSECURE_TLS;
// with a trustedCAProxy it trusts the proxy's CA, copied from the install
// namespace's ConfigMap into its worker Secret and mounted from there.
func TestImportWorkerSpecRegistryAndProxyCA(t *testing.T) {
	const installNS, caPEM = "kubefill", "-----BEGIN CERTIFICATE-----\nproxy\n-----END CERTIFICATE-----\n"
	caMap := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: installNS, Name: "proxy-ca"}, Data: map[string]string{"ca.crt": caPEM}}
	cases := []struct {
		name         string
		url          string
		trustedCA    string
		objs         []client.Object
		wantInsecure bool
		wantErr      string
	}{
		{"listed registry, proxy CA", "docker://registry.a.svc:5000/os/fedora:40", "proxy-ca", []client.Object{caMap}, true, ""},
		{"unlisted registry, no proxy CA", "docker://other.a.svc:5000/os/fedora:40", "", nil, false, ""},
		{"the proxy's CA ConfigMap is missing", "docker://registry.a.svc:5000/os/fedora:40", "proxy-ca", nil, false, "kubefill/proxy-ca"},
		{"the proxy's CA ConfigMap is empty", "docker://registry.a.svc:5000/os/fedora:40", "proxy-ca",
			[]client.Object{&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: installNS, Name: "proxy-ca"}}}, false, "is empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := &ImportKind{Client: fake.NewClientBuilder().WithScheme(testScheme()).WithObjects(c.objs...).Build(), Namespace: installNS}
			config := &cdiv1.CDIConfig{Spec: cdiv1.CDIConfigSpec{InsecureRegistries: []string{"registry.a.svc:5000"}}}
			if c.trustedCA != "" {
				config.Status.ImportProxy = &cdiv1.ImportProxy{HTTPSProxy: ptr.To("http://proxy.test:3128"), TrustedCAProxy: ptr.To(c.trustedCA)}
			}
			f := importFlow("tenant", c.url)
			spec, err := k.WorkerSpec(context.Background(), f, config)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want one naming %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			env := map[string]string{}
			for _, e := range spec.Container.Env {
				env[e.Name] = e.Value
			}
			if got := env[contract.EnvInsecureTLS] == "true"; got != c.wantInsecure {
				t.Errorf("INSECURE_TLS set %v, want %v", got, c.wantInsecure)
			}
			i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == contract.ProxyCertVolume })
			if c.trustedCA == "" {
				if i >= 0 || env[contract.EnvProxyCertDir] != "" || spec.SecretData[proxyCAKey] != nil {
					t.Errorf("a proxy CA without trustedCAProxy: %+v", spec)
				}
				return
			}
			secretName := WorkerSecretName(k.PodName(f.Prime))
			if i < 0 || spec.Volumes[i].Secret == nil || spec.Volumes[i].Secret.SecretName != secretName ||
				!slices.Equal(spec.Volumes[i].Secret.Items, []corev1.KeyToPath{{Key: proxyCAKey, Path: "ca.crt"}}) {
				t.Fatalf("volumes %+v, want the worker Secret %s's %s as ca.crt", spec.Volumes, secretName, proxyCAKey)
			}
			if string(spec.SecretData[proxyCAKey]) != caPEM {
				t.Errorf("worker Secret's %s = %q, want the ConfigMap's CA", proxyCAKey, spec.SecretData[proxyCAKey])
			}
			if spec.SecretData[contract.EnvHTTPSProxy] == nil {
				t.Error("the proxy URL left the worker Secret")
			}
			if !slices.ContainsFunc(spec.Container.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.Name == contract.ProxyCertVolume && m.MountPath == contract.ProxyCertDir && m.ReadOnly
			}) || env[contract.EnvProxyCertDir] != contract.ProxyCertDir {
				t.Errorf("mounts %+v env %v", spec.Container.VolumeMounts, env)
			}
		})
	}
	// A blank image reaches nothing: no proxy CA, even one missing.
	blank := importFlow("tenant", "")
	blank.Source.(*cdiv1.VolumeImportSource).Spec.Source = &cdiv1.ImportSourceType{Blank: &cdiv1.DataVolumeBlankImage{}}
	missing := &cdiv1.CDIConfig{Status: cdiv1.CDIConfigStatus{ImportProxy: &cdiv1.ImportProxy{TrustedCAProxy: ptr.To("proxy-ca")}}}
	k := &ImportKind{Client: fake.NewClientBuilder().WithScheme(testScheme()).Build(), Namespace: installNS}
	if spec, err := k.WorkerSpec(context.Background(), blank, missing); err != nil || spec.SecretData[proxyCAKey] != nil {
		t.Errorf("a blank image: %v, Secret data %v", err, spec.SecretData)
	}
	// A controller that does not know its install namespace says so.
	k = &ImportKind{Client: fake.NewClientBuilder().WithScheme(testScheme()).Build()}
	if _, err := k.WorkerSpec(context.Background(), importFlow("tenant", "docker://r/x"), missing); err == nil || !strings.Contains(err.Error(), "POD_NAMESPACE") {
		t.Errorf("without an install namespace: %v", err)
	}
}
