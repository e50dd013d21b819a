package installed

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/tests/kit"
)

func schemaGVR(group, version, resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: group, Version: version, Resource: resource}
}

const shellImage = "busybox:1.36"

// dvPhase waits for DataVolume ns/name to reach Succeeded, failing on Failed.
func waitSucceeded(t *testing.T, ns, name string, timeout time.Duration) *cdiv1.DataVolume {
	t.Helper()
	dv := &cdiv1.DataVolume{}
	kit.Eventually(t, timeout, time.Second, "DataVolume "+ns+"/"+name+" to succeed", func() (bool, string, error) {
		if err := kc.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, dv); err != nil {
			return false, err.Error(), nil
		}
		if dv.Status.Phase == cdiv1.Failed {
			t.Fatalf("DataVolume %s failed: %+v", name, dv.Status.Conditions)
		}
		return dv.Status.Phase == cdiv1.Succeeded, fmt.Sprintf("%s %s", dv.Status.Phase, dv.Status.Progress), nil
	})
	return dv
}

// readBack runs a pod that hashes the first n bytes of the claim's disk.img.
func readBack(t *testing.T, ns, claim string, n int) string {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read-" + claim},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "read", Image: shellImage, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"sh", "-c", fmt.Sprintf("head -c %d /data/disk.img | sha256sum | cut -d' ' -f1 > /dev/termination-log", n)},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
	if err := kc.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = kc.Delete(ctx, pod) }()
	return podReport(t, kc, pod, 2*time.Minute, time.Second, "to read the claim")
}

// podReport waits until pod's container exits 0 and returns its
// termination message (what the test's shell pods report, such as a
// sha256); a failed pod fails the test.
func podReport(t *testing.T, c client.Client, pod *corev1.Pod, timeout, interval time.Duration, what string) string {
	t.Helper()
	ctx := context.Background()
	var msg string
	kit.Eventually(t, timeout, interval, "pod "+pod.Name+" "+what, func() (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return false, err.Error(), nil
		}
		if pod.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod %s failed: %+v", pod.Name, pod.Status.ContainerStatuses)
		}
		for _, s := range pod.Status.ContainerStatuses {
			if term := s.State.Terminated; term != nil && term.ExitCode == 0 {
				msg = strings.TrimSpace(term.Message)
			}
		}
		return msg != "", string(pod.Status.Phase), nil
	})
	return msg
}

// testDisk writes a raw disk of size bytes with random blocks and returns
// its path and sha256.
func testDisk(t *testing.T, dir string, size int) (string, string) {
	t.Helper()
	b := make([]byte, size)
	for off := 0; off < size; off += 1 << 20 {
		_, _ = rand.Read(b[off : off+64<<10])
	}
	p := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return p, hex.EncodeToString(sum[:])
}

func storageSpec(size string) *cdiv1.StorageSpec {
	return &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}
}

// TestInstalled runs the smoke set against the installed components.
func TestInstalled(t *testing.T) {
	ctx := context.Background()
	// The CDI resource, as CDI's release ships it (KubeVirt wants one).
	cr := &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}}
	if err := kc.Create(ctx, cr); err != nil {
		t.Fatalf("creating the CDI resource: %v", err)
	}
	// Part of the install's health: the phase once the controller reports it.
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if err := kc.Get(ctx, client.ObjectKeyFromObject(cr), cr); err == nil && cr.Status.Phase == "Deployed" {
			break
		}
	}
	out, err := getCDIAndDeployments(ctx, installNS)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl get cdi,deploy -n %s:\n%s", installNS, out)
	for _, c := range cr.Status.Conditions {
		t.Logf("CDI condition %s=%s reason %s: %s", c.Type, c.Status, c.Reason, c.Message)
	}

	t.Run("certificates", func(t *testing.T) {
		bundle := &corev1.ConfigMap{}
		if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.BundleName(certs.APIServerSigner)}, bundle); err != nil {
			t.Fatal(err)
		}
		want := bundle.Data[certs.BundleKey]
		api, err := dyn.Resource(schemaGVR("apiregistration.k8s.io", "v1", "apiservices")).Get(ctx, "v1beta1.upload.cdi.kubevirt.io", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b64, _, _ := unstructured.NestedString(api.Object, "spec", "caBundle")
		if got, _ := base64.StdEncoding.DecodeString(b64); string(got) != want {
			t.Errorf("the APIService's caBundle is not %s", certs.BundleName(certs.APIServerSigner))
		}
		hooks := 0
		vws := &admissionregistrationv1.ValidatingWebhookConfigurationList{}
		mws := &admissionregistrationv1.MutatingWebhookConfigurationList{}
		if err := kc.List(ctx, vws); err != nil {
			t.Fatal(err)
		}
		if err := kc.List(ctx, mws); err != nil {
			t.Fatal(err)
		}
		var configs []admissionregistrationv1.WebhookClientConfig
		for _, w := range vws.Items {
			for _, h := range w.Webhooks {
				configs = append(configs, h.ClientConfig)
			}
		}
		for _, w := range mws.Items {
			for _, h := range w.Webhooks {
				configs = append(configs, h.ClientConfig)
			}
		}
		for _, cc := range configs {
			if cc.Service == nil || cc.Service.Namespace != installNS {
				continue
			}
			hooks++
			if string(cc.CABundle) != want {
				t.Errorf("webhook to %s%s has another caBundle", cc.Service.Name, ptrString(cc.Service.Path))
			}
		}
		if hooks < 3 {
			t.Errorf("only %d webhooks point at the install", hooks)
		}
		t.Logf("the APIService and %d webhooks carry %s (%d CA)", hooks, certs.BundleName(certs.APIServerSigner), strings.Count(want, "BEGIN CERTIFICATE"))
	})

	ns := "installed-smoke"
	if err := kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	// Gone after the test, as every test's namespace is: tests/load runs on
	// this cluster next.
	t.Cleanup(func() {
		_ = kc.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	dir := t.TempDir()
	disk, diskSum := testDisk(t, dir, 8<<20)

	t.Run("import", func(t *testing.T) {
		gw, err := cl.GatewayAddress()
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(gw, "0"))
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.FileServer(http.Dir(dir)), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "imported"},
			Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://" + ln.Addr().String() + "/disk.raw"}},
				Storage: storageSpec("64Mi")}}
		start := time.Now()
		if err := kc.Create(ctx, dv); err != nil {
			t.Fatal(err)
		}
		waitSucceeded(t, ns, dv.Name, 4*time.Minute)
		if got := readBack(t, ns, dv.Name, 8<<20); got != diskSum {
			t.Fatalf("imported bytes hash %s, want %s", got, diskSum)
		}
		t.Logf("HTTP import by the installed controller's importer pod: Succeeded in %s, bytes match", time.Since(start).Round(100*time.Millisecond))
	})

	proxySvc := &corev1.Service{}
	if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.DefaultUploadProxyService}, proxySvc); err != nil {
		t.Fatal(err)
	}
	proxyURL := "https://" + net.JoinHostPort(proxySvc.Spec.ClusterIP, "443")

	t.Run("virtctl image-upload", func(t *testing.T) {
		bin := os.Getenv("KUBEFILL_VIRTCTL")
		if bin == "" {
			t.Skip("KUBEFILL_VIRTCTL is not set (hack/virtctl.sh builds KubeVirt's virtctl)")
		}
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, bin, "image-upload", "dv", "uploaded", "--namespace="+ns, "--size=64Mi", "--image-path="+disk,
			"--uploadproxy-url="+proxyURL, "--insecure", "--wait-secs=180", "--kubeconfig="+cl.Kubeconfig)
		out, err := cmd.CombinedOutput()
		t.Logf("virtctl image-upload dv through the installed proxy %s (%s):\n%s", proxyURL, time.Since(start).Round(100*time.Millisecond), lastLines(string(out), 12))
		if err != nil {
			t.Fatalf("virtctl image-upload: %v", err)
		}
		waitSucceeded(t, ns, "uploaded", 2*time.Minute)
		if got := readBack(t, ns, "uploaded", 8<<20); got != diskSum {
			t.Fatalf("uploaded bytes hash %s, want %s", got, diskSum)
		}
	})

	t.Run("clone", func(t *testing.T) {
		dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cloned"},
			Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: "imported"}}, Storage: storageSpec("64Mi")}}
		start := time.Now()
		if err := kc.Create(ctx, dv); err != nil {
			t.Fatal(err)
		}
		got := waitSucceeded(t, ns, dv.Name, 4*time.Minute)
		if sum := readBack(t, ns, dv.Name, 8<<20); sum != diskSum {
			t.Fatalf("cloned bytes hash %s, want %s", sum, diskSum)
		}
		t.Logf("clone (%s) Succeeded in %s, bytes match", got.Annotations[cdiv1.AnnCloneType], time.Since(start).Round(100*time.Millisecond))
	})

	t.Run("bad token", func(t *testing.T) {
		ca := &corev1.ConfigMap{}
		if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.BundleName(certs.UploadProxySigner)}, ca); err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM([]byte(ca.Data[certs.BundleKey]))
		// Verified against the proxy's own chain, by its cluster IP.
		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
		req, _ := http.NewRequest(http.MethodPost, proxyURL+"/v1beta1/upload", bytes.NewReader([]byte("not a disk")))
		req.Header.Set("Authorization", "Bearer not.a.token")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("POST to the installed proxy, trusting %s: %v", certs.BundleName(certs.UploadProxySigner), err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("a forged token: %d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a forged token got %d %s, want 401", resp.StatusCode, body)
		}
	})

	t.Run("validating webhook refusal", func(t *testing.T) {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "taken"},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}}}}
		if err := kc.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "taken"},
			Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, Storage: storageSpec("16Mi")}}
		err := kc.Create(ctx, dv)
		t.Logf("a DataVolume over a claim it does not own: %v", err)
		if err == nil || !strings.Contains(err.Error(), "datavolume-validate.cdi.kubevirt.io") || !strings.Contains(err.Error(), "not owned by a DataVolume") {
			t.Fatalf("want a refusal by the installed validating webhook, got %v", err)
		}
	})

	// The install requires kube-apiserver's webhook client certificate
	// (cluster.InstallOptions adds --webhook-client-names; the subtests
	// above went through the webhooks, so kube-apiserver presents it). A
	// forged review sent straight to the Service, as any pod could, is
	// refused before it is read.
	t.Run("webhook caller authentication", func(t *testing.T) {
		svc := &corev1.Service{}
		if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.DefaultAPIServerService}, svc); err != nil {
			t.Fatal(err)
		}
		review := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"forged","kind":{"group":"cdi.kubevirt.io","version":"v1beta1","kind":"DataVolume"},` +
			`"operation":"CREATE","namespace":"` + ns + `","name":"t-oracle","userInfo":{"username":"system:admin","groups":["system:masters"]},` +
			`"object":{"apiVersion":"cdi.kubevirt.io/v1beta1","kind":"DataVolume","metadata":{"name":"t-oracle","namespace":"` + ns + `"},` +
			`"spec":{"source":{"pvc":{"namespace":"kube-system","name":"anything"}},"storage":{"resources":{"requests":{"storage":"1Gi"}}}}}}}`
		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}}
		url := "https://" + net.JoinHostPort(svc.Spec.ClusterIP, "443") + "/datavolume-mutate"
		resp, err := hc.Post(url, "application/json", strings.NewReader(review))
		if err != nil {
			t.Fatalf("POST %s: %v", url, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("a forged AdmissionReview to %s without kube-apiserver's certificate: %d %s", url, resp.StatusCode, strings.TrimSpace(string(body)))
		if resp.StatusCode != http.StatusUnauthorized || strings.Contains(string(body), "storage.clone.token") {
			t.Fatalf("got %d %s, want 401 and no token", resp.StatusCode, body)
		}
	})
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
