package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/pkg/uploadcli"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// uploadStack is what a user uploads through: the shared Kubefill
// controller (in this process), and `kubefill apiserver` behind the real
// APIService and `kubefill uploadproxy` as the cluster's processes.
type uploadStack struct {
	c         client.Client
	installNS string
	svc       *cluster.UploadServices
}

// sharedUploads is the shared stack's upload side.
func sharedUploads() *uploadStack {
	return &uploadStack{c: shared.c, installNS: shared.installNS, svc: shared.svc}
}

// kubefillCLI runs the kubefill binary of this checkout as a user would,
// with the cluster's admin kubeconfig, and returns its combined output.
func kubefillCLI(t *testing.T, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx := testContext(t, timeout)
	cmd := exec.CommandContext(ctx, cl.KubefillBinary(), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cl.Kubeconfig)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// proxyClient trusts the upload proxy's serving certificate, nothing more.
func (s *uploadStack) proxyClient(t *testing.T) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(s.svc.ProxyCAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	return &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
}

// TestUploadCLIThroughProxy is the user's upload: `kubefill upload dv`
// finds the proxy in CDIConfig, creates the DataVolume, gets a token
// through kube-apiserver's aggregator, and streams a qcow2 through the
// proxy into the upload pod. The DataVolume ends Succeeded holding what
// qemu-img converts the image to.
func TestUploadCLIThroughProxy(t *testing.T) {
	parallel(t)
	s := sharedUploads()
	ns := newNamespace(t)
	dir := t.TempDir()
	name, virtualSize, want := testImage(t, dir)
	start := time.Now()
	out, err := kubefillCLI(t, 4*time.Minute, "upload", "dv", "laptop", "--namespace="+ns, "--size=128Mi",
		"--volume-mode=filesystem", "--image-path="+filepath.Join(dir, name), "--ca-cert="+s.svc.ProxyCAFile, "--wait-secs=180")
	t.Logf("kubefill upload dv took %s; its output:\n%s", time.Since(start).Round(time.Millisecond), lastLines(out, 12))
	if err != nil {
		t.Fatalf("kubefill upload: %v\nevents:\n%s", err, eventsFor(ns, "laptop"))
	}
	for _, want := range []string{"DataVolume " + ns + "/laptop created", s.svc.ProxyURL + "/v1beta1/upload-async", "succeeded"} {
		if !strings.Contains(out, want) {
			t.Errorf("the CLI's output lacks %q", want)
		}
	}
	dv := &cdiv1.DataVolume{}
	if err := s.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "laptop"}, dv); err != nil {
		t.Fatal(err)
	}
	if dv.Status.Phase != cdiv1.Succeeded || dv.Status.Progress != "100.0%" {
		t.Fatalf("DataVolume %s %s after the CLI returned", dv.Status.Phase, dv.Status.Progress)
	}
	if got := claimSHA256(t, ns, "laptop", virtualSize); got != want {
		t.Errorf("claim holds sha256 %s over %d bytes, qemu-img convert gives %s", got, virtualSize, want)
	}
}

// TestUploadArchiveThroughProxy: `kubefill upload dv --archive-path` makes
// an archive DataVolume on a Filesystem volume, and the tar's files land in
// the volume with their contents.
func TestUploadArchiveThroughProxy(t *testing.T) {
	parallel(t)
	s := sharedUploads()
	ns := newNamespace(t)
	blob := make([]byte, 3<<20+17)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"blob.bin": blob, "etc/motd": []byte("uploaded by kubefill\n")}
	archive := filepath.Join(t.TempDir(), "data.tar")
	writeTar(t, archive, files)
	out, err := kubefillCLI(t, 4*time.Minute, "upload", "dv", "appdata", "--namespace="+ns, "--size=64Mi",
		"--archive-path="+archive, "--ca-cert="+s.svc.ProxyCAFile, "--wait-secs=180")
	t.Logf("kubefill upload dv --archive-path:\n%s", lastLines(out, 8))
	if err != nil {
		t.Fatalf("kubefill upload: %v\nevents:\n%s", err, eventsFor(ns, "appdata"))
	}
	dv := &cdiv1.DataVolume{}
	if err := s.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "appdata"}, dv); err != nil {
		t.Fatal(err)
	}
	if dv.Spec.ContentType != cdiv1.DataVolumeArchive || dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("DataVolume contentType %q phase %s", dv.Spec.ContentType, dv.Status.Phase)
	}
	got := runToCompletion(t, ns, podWithClaim("list-appdata", "appdata", false,
		"cd /data && sha256sum blob.bin etc/motd > /dev/termination-log && ls -A >> /dev/termination-log"))
	for name, data := range files {
		sum := sha256.Sum256(data)
		if line := hex.EncodeToString(sum[:]) + "  " + name; !strings.Contains(got, line) {
			t.Errorf("the volume lacks %s with its contents; the pod saw:\n%s", name, got)
		}
	}
	if strings.Contains(got, "disk.img") {
		t.Errorf("an archive upload left a disk.img in the volume:\n%s", got)
	}
}

func writeTar(t *testing.T, path string, files map[string][]byte) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	if err := tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(tw.Close(), f.Close()); err != nil {
		t.Fatal(err)
	}
}

// post sends body to the proxy's upload path with the token.
func (s *uploadStack) post(hc *http.Client, tok string, body io.Reader, size int64) (int, string, error) {
	return postUpload(hc, s.svc.ProxyURL+"/v1beta1/upload", tok, body, size)
}

// TestUploadProxyRefusesBadTokensAndSecondUpload goes through the running
// proxy: forged, expired and re-targeted tokens get 401 and change nothing;
// a second upload while one is streaming gets 503; the first upload's
// connection then dies halfway, the DataVolume stays UploadReady, and a
// retry with a token from the UploadTokenRequest API succeeds.
func TestUploadProxyRefusesBadTokensAndSecondUpload(t *testing.T) {
	parallel(t)
	s := sharedUploads()
	ns := newNamespace(t)
	for _, name := range []string{"target", "other"} {
		if err := s.c.Create(context.Background(), kit.DataVolume(ns, name, kit.Upload(), kit.WithPVC(filesystemClaim("128Mi")))); err != nil {
			t.Fatal(err)
		}
	}
	waitUploadReady(t, s.c, ns, "target")
	dir := t.TempDir()
	name, virtualSize, want := testImage(t, dir)
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	hc := s.proxyClient(t)

	// Tokens from the real API, through kube-apiserver's aggregator.
	valid, err := uploadcli.RequestToken(context.Background(), cl.Config, ns, "target")
	if err != nil {
		t.Fatalf("UploadTokenRequest: %v", err)
	}
	forOther, err := uploadcli.RequestToken(context.Background(), cl.Config, ns, "other")
	if err != nil {
		t.Fatalf("UploadTokenRequest: %v", err)
	}
	secret := &corev1.Secret{}
	if err := s.c.Get(context.Background(), types.NamespacedName{Namespace: s.installNS, Name: token.DefaultSigningKeySecretName}, secret); err != nil {
		t.Fatal(err)
	}
	keys, err := token.KeySetFromSecret(secret, true)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	payload := token.NewUploadPayload(ns, "target")
	forged := mustGenerate(t, token.NewGenerator(token.UploadTokenIssuer, stranger, time.Minute), payload)
	hourAgo := func() time.Time { return time.Now().Add(-time.Hour) }
	expired := mustGenerate(t, token.NewGeneratorAt(token.UploadTokenIssuer, keys.Private, token.DefaultUploadTokenLifetime, hourAgo), payload)

	for _, tc := range []struct{ name, tok, want string }{
		{"no token", "", "missing the Authorization"},
		{"forged: signed by another key", forged, "signature"},
		{"expired", expired, "expired"},
		{"the other claim's token re-targeted at this claim", retarget(t, forOther, "other", "target"), "signature"},
	} {
		code, body, err := s.post(hc, tc.tok, bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		t.Logf("%s: %d %s", tc.name, code, body)
		if code != http.StatusUnauthorized || !strings.Contains(body, tc.want) {
			t.Errorf("%s: got %d %q, want 401 mentioning %q", tc.name, code, body, tc.want)
		}
	}
	assertPhase(t, s.c, ns, "target", cdiv1.UploadReady)

	// The first upload streams half the image, then hangs there.
	pr, pw := io.Pipe()
	first := make(chan error, 1)
	go func() {
		code, body, err := s.post(hc, valid, pr, int64(len(data)))
		if err == nil {
			err = fmt.Errorf("the interrupted upload got an answer: %d %s", code, body)
		}
		first <- err
	}()
	if _, err := pw.Write(data[:len(data)/2]); err != nil {
		t.Fatal(err)
	}
	// Once the upload server counts those bytes (the claim's progress moves),
	// it is busy with the first upload; this also shows the proxy streams.
	start := time.Now()
	kit.Until(t, time.Minute, "the first upload's bytes to reach the upload server", func() bool {
		pvc := &corev1.PersistentVolumeClaim{}
		if err := s.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "target"}, pvc); err != nil {
			return false
		}
		p := pvc.Annotations[cdiv1.AnnPopulatorProgress]
		return p != "" && p != "0.00%"
	})
	t.Logf("the upload server counted the first upload's bytes %s after they were sent", time.Since(start).Round(time.Millisecond))
	// A second upload meanwhile is refused while the first holds the server.
	code, body, err := s.post(hc, valid, bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second upload while the first streams: %d %s", code, body)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("second concurrent upload: got %d %q, want 503", code, body)
	}
	// The first upload's client dies.
	pw.CloseWithError(errors.New("the laptop lost its network"))
	select {
	case err := <-first:
		t.Logf("interrupted upload ended: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the interrupted upload did not end")
	}
	assertPhase(t, s.c, ns, "target", cdiv1.UploadReady)

	retryUpload(t, hc, s.svc.ProxyURL+"/v1beta1/upload", valid, data, func() {})
	dv, seen := kit.WaitDataVolumeTerminal(t, s.c, ns, "target", 3*time.Minute)
	if dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("DataVolume ended %s (%v)\nevents:\n%s", dv.Status.Phase, seen, eventsFor(ns, "target"))
	}
	if got := claimSHA256(t, ns, "target", virtualSize); got != want {
		t.Errorf("claim holds sha256 %s over %d bytes, qemu-img convert gives %s", got, virtualSize, want)
	}
	// A claim that has its data takes no second upload.
	if code, body, err := s.post(hc, valid, bytes.NewReader(data), int64(len(data))); err != nil || code != http.StatusConflict {
		t.Errorf("upload into the populated claim: %d %q %v, want 409", code, body, err)
	}
	// The other claim, whose token was edited, still waits for its upload.
	waitUploadReady(t, s.c, ns, "other")
}

func assertPhase(t *testing.T, c client.Client, ns, name string, want cdiv1.DataVolumePhase) {
	t.Helper()
	dv := &cdiv1.DataVolume{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, dv); err != nil {
		t.Fatal(err)
	}
	if dv.Status.Phase != want {
		t.Fatalf("DataVolume %s/%s is %s, want %s", ns, name, dv.Status.Phase, want)
	}
}

func mustGenerate(t *testing.T, g token.Generator, p *token.Payload) string {
	t.Helper()
	s, err := g.Generate(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// retarget edits a signed token's payload to name another claim, keeping
// the signature: what someone holding one claim's token might try.
func retarget(t *testing.T, tok, from, to string) string {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token has %d parts", len(parts))
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(raw), `"name":"`+from+`"`, `"name":"`+to+`"`, 1)
	if changed == string(raw) {
		t.Fatalf("payload %s does not name %s", raw, from)
	}
	parts[1] = base64.RawURLEncoding.EncodeToString([]byte(changed))
	return strings.Join(parts, ".")
}

// TestUpload2GiBMemory uploads a 2 GiB raw image with `kubefill upload`
// through the proxy and samples the peak resident memory (VmHWM) of the
// upload proxy and of the upload server while it streams: each must stay
// under 64 MiB, whatever the image's size. The proxy is the shared one: its
// peak is reset first, so that earlier uploads do not count, and the test
// is in the serial group, so that no other upload does.
func TestUpload2GiBMemory(t *testing.T) {
	s := sharedUploads()
	ns := newNamespace(t)
	const size = 2 << 30
	image := filepath.Join(t.TempDir(), "big.raw")
	f, err := os.Create(image)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	// Data every 64 MiB; the rest are zeros, which still cross the wire.
	block := make([]byte, 1<<20)
	for off := int64(0); off < size; off += 64 << 20 {
		if _, err := rand.Read(block); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(block, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	want := testimg.FileSHA256(t, image)
	resetPeakRSS(t, s.svc.ProxyPID())

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var proxyPeak, serverPeak int64
	serverPID := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if v := processPeakRSS(s.svc.ProxyPID()); v > proxyPeak {
				proxyPeak = v
			}
			if serverPID == 0 || processPeakRSS(serverPID) == 0 {
				serverPID = findProcess("uploadserver")
			}
			if v := processPeakRSS(serverPID); v > serverPeak {
				serverPeak = v
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	out, err := kubefillCLI(t, 8*time.Minute, "upload", "dv", "big", "--namespace="+ns, "--size=3Gi",
		"--volume-mode=filesystem", "--image-path="+image, "--ca-cert="+s.svc.ProxyCAFile, "--wait-secs=300")
	took := time.Since(start)
	close(stop)
	wg.Wait()
	t.Logf("kubefill upload of 2 GiB:\n%s", lastLines(out, 6))
	if err != nil {
		t.Fatalf("kubefill upload: %v\nevents:\n%s", err, eventsFor(ns, "big"))
	}
	fmt.Printf("upload of 2 GiB through the proxy in %s (CLI start to Succeeded): upload proxy peak RSS %.1f MiB, upload server peak RSS %.1f MiB\n",
		took.Round(time.Millisecond), float64(proxyPeak)/(1<<20), float64(serverPeak)/(1<<20))
	if proxyPeak == 0 || serverPeak == 0 {
		t.Fatalf("memory not sampled: proxy %d, upload server %d (pid %d)", proxyPeak, serverPeak, serverPID)
	}
	for what, v := range map[string]int64{"upload proxy": proxyPeak, "upload server": serverPeak} {
		if v >= 64<<20 {
			t.Errorf("%s peak RSS %.1f MiB, want under 64 MiB", what, float64(v)/(1<<20))
		}
	}
	if got := claimSHA256(t, ns, "big", size); got != want {
		t.Errorf("claim holds sha256 %s, the image has %s", got, want)
	}
}

// processPeakRSS reads a process's VmHWM in bytes; 0 if it is gone.
func processPeakRSS(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// resetPeakRSS sets a process's VmHWM back to its current resident size
// (proc(5): writing 5 to /proc/PID/clear_refs).
func resetPeakRSS(t *testing.T, pid int) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatalf("resetting the peak RSS of pid %d: %v", pid, err)
	}
}

// findProcess returns the pid of a running `kubefill <subcommand>` (a
// container's processes are the host's too, seen from outside), or 0.
func findProcess(subcommand string) int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 1 && filepath.Base(args[0]) == "kubefill" && args[1] == subcommand {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	return 0
}

// lastLines keeps the end of a long output (progress bars redraw a lot).
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
