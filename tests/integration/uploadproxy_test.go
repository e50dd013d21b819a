package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/importer"
	"github.com/kubefill/kubefill/pkg/pki"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/pkg/uploadproxy"
	"github.com/kubefill/kubefill/pkg/uploadserver"
	"github.com/kubefill/kubefill/tests/kit"
)

// uploadRig is a real upload server (the upload pod of prime, on loopback)
// and a real upload proxy (uploadproxy.Run) in front of it.
type uploadRig struct {
	ns, prime string
	proxyURL  string
	proxyCA   string // the proxy's serving CA, as a file
	volume    string // the upload server's Filesystem volume
	us        *uploadserver.Server
}

// startUploadRig starts both against restCfg; pubKeyPEM is the token
// signing key the proxy trusts, as mounted from the apiserver's Secret.
func startUploadRig(t *testing.T, ctx context.Context, restCfg *rest.Config, ns, prime string, pubKeyPEM []byte) *uploadRig {
	t.Helper()
	dir := t.TempDir()
	r := &uploadRig{ns: ns, prime: prime, volume: filepath.Join(dir, "volume")}

	// PKI: the upload server's CA and serving certificate for the Service
	// name, and the client CA that signs the proxy's certificate.
	serverCA, err := pki.NewCA("upload-server-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clientCA, err := pki.NewCA("upload-proxy-client-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srvCrt, srvKey, err := serverCA.Issue("cdi-upload-"+prime, []string{uploadproxy.ServiceHost(ns, prime)}, false, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cliCrt, cliKey, err := clientCA.Issue("kubefill-uploadproxy", nil, true, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	proxyCert, err := pki.GenerateServingCert("kubefill-uploadproxy", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"srv.crt": srvCrt, "srv.key": srvKey, "client-ca.crt": clientCA.CertPEM, "cli.crt": cliCrt, "cli.key": cliKey, "server-ca.crt": serverCA.CertPEM,
		"proxy.crt": proxyCert.CertPEM, "proxy.key": proxyCert.KeyPEM, "proxy-ca.crt": proxyCert.CAPEM,
	}
	for name, b := range files {
		writeFile(t, dir, name, b)
	}
	r.proxyCA = filepath.Join(dir, "proxy-ca.crt")

	// The upload server, as the upload pod would run it.
	for _, d := range []string{r.volume, filepath.Join(dir, "scratch")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	addrc := make(chan string, 1)
	r.us, err = uploadserver.New(uploadserver.Config{
		Addr: "127.0.0.1:0", CertFile: filepath.Join(dir, "srv.crt"), KeyFile: filepath.Join(dir, "srv.key"), ClientCAFile: filepath.Join(dir, "client-ca.crt"),
		ClientName: "kubefill-uploadproxy",
		Paths: importer.Paths{
			DataPath: filepath.Join(r.volume, "disk.img"), BlockPath: filepath.Join(dir, "no-block-device"),
			ScratchDir: filepath.Join(dir, "scratch"), TerminationLog: filepath.Join(dir, "termination-log"),
		},
		ImageSize: 8 << 20, OwnerUID: "uid-1", OnListen: func(a string) { addrc <- a },
	}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	usErr := make(chan error, 1)
	go func() { usErr <- r.us.Run(ctx) }()
	var usAddr string
	select {
	case usAddr = <-addrc:
	case err := <-usErr:
		t.Fatalf("upload server: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("upload server did not listen")
	}
	_, usPort, _ := net.SplitHostPort(usAddr)
	port, _ := strconv.Atoi(usPort)

	// The signing key, mounted as the apiserver's Secret would be.
	keyDir := filepath.Join(dir, "signing-key")
	if err := os.Mkdir(keyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, keyDir, token.SecretPublicKey, pubKeyPEM)

	// The proxy itself.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyErr := make(chan error, 1)
	go func() {
		proxyErr <- uploadproxy.Run(ctx, restCfg, uploadproxy.RunOptions{
			Listener: ln, CertFile: filepath.Join(dir, "proxy.crt"), KeyFile: filepath.Join(dir, "proxy.key"),
			SigningKeyDir: keyDir, TokenLeeway: 5 * time.Second,
			Upstream: uploadproxy.UpstreamTLS{ClientCertFile: filepath.Join(dir, "cli.crt"), ClientKeyFile: filepath.Join(dir, "cli.key"), CAFile: filepath.Join(dir, "server-ca.crt")},
			Address:  uploadproxy.AddressPodIP, UpstreamPort: port, PodWait: 6 * time.Second,
		})
	}()
	r.proxyURL = "https://" + ln.Addr().String()
	httpc := r.client(t)
	kit.Until(t, 30*time.Second, "the upload proxy to serve /healthz", func() bool {
		select {
		case err := <-proxyErr:
			t.Fatalf("upload proxy exited: %v", err)
		default:
		}
		resp, err := httpc.Get(r.proxyURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	return r
}

// client trusts the proxy's serving CA.
func (r *uploadRig) client(t *testing.T) *http.Client {
	t.Helper()
	pemBytes, err := os.ReadFile(r.proxyCA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemBytes)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}, Timeout: 2 * time.Minute}
}

// playUploadPopulator does what the upload populator does once target
// exists: it creates the prime and its upload pod (no kubelet here: the pod's
// IP is set to loopback by hand), points the target at the prime, and after
// readyAfter marks the pod ready.
func playUploadPopulator(t *testing.T, ctx context.Context, c client.Client, target *corev1.PersistentVolumeClaim, prime string, readyAfter time.Duration) *corev1.PersistentVolumeClaim {
	t.Helper()
	primePVC := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: target.Namespace, Name: prime}, Spec: *target.Spec.DeepCopy()}
	primePVC.Spec.DataSourceRef, primePVC.Spec.DataSource = nil, nil
	mustCreate(t, c, primePVC)
	patchAnnotations(t, c, target, map[string]string{cdiv1.AnnPVCPrimeName: prime})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: target.Namespace, Name: cdiv1.UploadPodName(prime)},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptrTo(false),
			Containers:                   []corev1.Container{{Name: "server", Image: "kubefill/kubefill:dev", Args: []string{"uploadserver"}}},
		},
	}
	mustCreate(t, c, pod)
	pod.Status.PodIP = "127.0.0.1"
	pod.Status.PodIPs = []corev1.PodIP{{IP: "127.0.0.1"}}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatalf("setting the upload pod's IP: %v", err)
	}
	go func() {
		time.Sleep(readyAfter)
		patchAnnotations(t, c, primePVC, map[string]string{cdiv1.AnnPodReady: "true"})
	}()
	return primePVC
}

// TestUploadProxyToUploadServer runs `kubefill uploadproxy` (uploadproxy.Run)
// against the real kube-apiserver and a real upload server on loopback: the
// proxy follows the PVC to its prime, waits for storage.pod.ready, reads the
// upload pod's IP, and streams the bytes over mutual TLS onto the volume.
func TestUploadProxyToUploadServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := newNamespace(t)
	prime := "prime-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := token.EncodePublicKeyPEM(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	gen := token.NewGenerator(token.UploadTokenIssuer, key, time.Minute)
	rig := startUploadRig(t, ctx, cfg, ns, prime, pub)
	proxyURL, volume, httpc := rig.proxyURL, rig.volume, rig.client(t)
	c := k8sClient
	post := func(pvc, path string, body []byte) (int, string) {
		t.Helper()
		tok, err := gen.Generate(token.NewUploadPayload(ns, pvc))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, proxyURL+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := httpc.Do(req)
		if err != nil {
			t.Fatalf("POST %s for %s: %v", path, pvc, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	// The claims: a target whose dataSourceRef names a VolumeUploadSource,
	// its prime, and the prime's upload pod (no kubelet: its IP is set by hand).
	group := cdiv1.GroupName
	claimSpec := *kit.ClaimSpec("8Mi")
	target := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "disk", Annotations: map[string]string{cdiv1.AnnUploadRequest: "", cdiv1.AnnUsePopulator: "true"}},
		Spec:       *claimSpec.DeepCopy(),
	}
	target.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: cdiv1.VolumeUploadSourceRef, Name: "disk"}
	mustCreate(t, c, target)

	// Before the prime exists the proxy waits, then gives up with 503.
	short := time.Now()
	code, body := post("disk", uploadproxy.PathUpload, []byte("x"))
	t.Logf("no prime yet: %d %s (after %s)", code, body, time.Since(short).Round(time.Millisecond))
	if code != http.StatusServiceUnavailable || !strings.Contains(body, cdiv1.AnnPVCPrimeName) {
		t.Fatalf("upload before the prime exists: %d %q, want 503 naming %s", code, body, cdiv1.AnnPVCPrimeName)
	}

	// The pod becomes ready a moment after the upload starts: the proxy waits for it.
	image := make([]byte, 3<<20+512)
	if _, err := rand.Read(image); err != nil {
		t.Fatal(err)
	}
	playUploadPopulator(t, ctx, c, target, prime, 2*time.Second)
	start := time.Now()
	code, body = post("disk", uploadproxy.PathUpload, image)
	t.Logf("upload through the proxy: %d %q after %s (waited for readiness)", code, body, time.Since(start).Round(time.Millisecond))
	if code != http.StatusOK {
		t.Fatalf("upload: %d %q", code, body)
	}
	got, err := os.ReadFile(filepath.Join(volume, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < len(image) || !bytes.Equal(got[:len(image)], image) {
		t.Fatalf("the volume holds %d bytes that do not start with the %d uploaded", len(got), len(image))
	}
	t.Logf("volume holds the %d uploaded bytes (file size %d)", len(image), len(got))

	// Once the population is complete, the proxy refuses without reaching the pod.
	patchAnnotations(t, c, target, map[string]string{cdiv1.AnnPopulatedFor: "disk"})
	code, body = post("disk", uploadproxy.PathUploadAsync, []byte("again"))
	if code != http.StatusConflict || !strings.Contains(body, "already received its upload") {
		t.Errorf("upload after completion: %d %q, want 409", code, body)
	}
	// A claim that is no upload target, and one that does not exist.
	mustCreate(t, c, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}, Spec: *claimSpec.DeepCopy()})
	if code, body = post("plain", uploadproxy.PathUpload, []byte("x")); code != http.StatusBadRequest || !strings.Contains(body, "not an upload target") {
		t.Errorf("upload into a plain claim: %d %q, want 400", code, body)
	}
	if code, body = post("missing", uploadproxy.PathUpload, []byte("x")); code != http.StatusNotFound {
		t.Errorf("upload into a missing claim: %d %q, want 404", code, body)
	}
}

func mustCreate(t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

func patchAnnotations(t *testing.T, c client.Client, obj client.Object, ann map[string]string) {
	t.Helper()
	orig := obj.DeepCopyObject().(client.Object)
	a := obj.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	for k, v := range ann {
		a[k] = v
	}
	obj.SetAnnotations(a)
	if err := c.Patch(context.Background(), obj, client.MergeFrom(orig)); err != nil {
		t.Errorf("annotating %s: %v", obj.GetName(), err)
	}
}
