package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/tests/kit"
)

// uploadClient is an HTTPS client that presents the upload proxy's client
// certificate, as the controller issued it, and verifies the upload pod's
// serving certificate for the pod's Service name.
func uploadClient(t *testing.T, c client.Client, installNS, serverName string) *http.Client {
	t.Helper()
	s := &corev1.Secret{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: installNS, Name: populators.UploadProxyClientSecret}, s); err != nil {
		t.Fatalf("the proxy's client Secret: %v", err)
	}
	cert, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(s.Data["ca.crt"]) {
		t.Fatal("the proxy's client Secret has no ca.crt")
	}
	return &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: serverName, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
	}}
}

// TestDataVolumeUploadQcow2 uploads a qcow2 straight to the upload pod (the
// proxy's part is tested on its own) with the proxy's client certificate:
// the DataVolume goes UploadScheduled, UploadReady, Succeeded, and the claim
// holds what qemu-img converts the image to. The pod, its Service and its
// Secret are gone afterwards.
func TestDataVolumeUploadQcow2(t *testing.T) {
	parallel(t)
	c, installNS := shared.c, shared.installNS
	ns := newNamespace(t)
	dir := t.TempDir()
	name, virtualSize, want := testImage(t, dir)

	dv := kit.DataVolume(ns, "laptop", kit.Upload(), kit.WithPVC(filesystemClaim("128Mi")))
	start := time.Now()
	if err := c.Create(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	_, seen := waitUploadReady(t, c, ns, "laptop")
	ready := time.Since(start)
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "laptop"}, pvc); err != nil {
		t.Fatal(err)
	}
	if pvc.Annotations[cdiv1.AnnPodReady] != "true" {
		t.Errorf("claim annotation %s = %q at UploadReady", cdiv1.AnnPodReady, pvc.Annotations[cdiv1.AnnPodReady])
	}
	prime := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: pvc.Annotations[cdiv1.AnnPVCPrimeName]}}
	podName := populators.UploadPodName(prime)
	pod := &corev1.Pod{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: podName}, pod); err != nil {
		t.Fatalf("upload pod: %v", err)
	}
	hc := uploadClient(t, c, installNS, cdiv1.UploadServiceHost(ns, prime.Name))
	base := "https://" + net.JoinHostPort(pod.Status.PodIP, fmt.Sprint(populators.UploadServerPort))

	// virtctl's probe, then the upload itself.
	req, _ := http.NewRequest(http.MethodHead, base+"/v1beta1/upload-async", nil)
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("HEAD upload-async: %v %v", resp, err)
	}
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	took := mustUpload(t, hc, base+"/v1beta1/upload", f, st.Size())
	t.Logf("uploaded %d bytes of qcow2 in %s (upload server ready %s after the DataVolume was created)", st.Size(), took.Round(time.Millisecond), ready.Round(time.Millisecond))

	dv, seen2 := kit.WaitDataVolumeTerminal(t, c, ns, "laptop", 3*time.Minute)
	t.Logf("phases seen: %v then %v", seen, seen2)
	if dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("DataVolume ended %s: %+v\nevents:\n%s", dv.Status.Phase, dv.Status.Conditions, eventsFor(ns, "laptop"))
	}
	if !strings.Contains(strings.Join(seen, " "), string(cdiv1.UploadScheduled)) {
		t.Errorf("phase UploadScheduled never seen: %v", seen)
	}
	kit.Eventually(t, 30*time.Second, 500*time.Millisecond, "the upload pod, its Service, Secret and prime to go", func() (bool, string, error) {
		left := []string{}
		for _, obj := range []client.Object{&corev1.Pod{}, &corev1.Service{}, &corev1.Secret{}, &corev1.PersistentVolumeClaim{}} {
			key := types.NamespacedName{Namespace: ns, Name: podName}
			if _, isClaim := obj.(*corev1.PersistentVolumeClaim); isClaim {
				key.Name = prime.Name
			}
			if err := c.Get(context.Background(), key, obj); err == nil {
				left = append(left, fmt.Sprintf("%T %s", obj, key.Name))
			}
		}
		return len(left) == 0, fmt.Sprintf("left behind after the upload: %v", left), nil
	})
	if got := claimSHA256(t, ns, "laptop", virtualSize); got != want {
		t.Errorf("claim holds sha256 %s over %d bytes, qemu-img convert gives %s", got, virtualSize, want)
	}
}

// waitUploadReady waits until an upload DataVolume's server is ready,
// and fails the test if the DataVolume fails first.
func waitUploadReady(t *testing.T, c client.Client, ns, name string) (*cdiv1.DataVolume, []string) {
	t.Helper()
	dv, seen := kit.WaitDataVolume(t, c, ns, name, 3*time.Minute, func(dv *cdiv1.DataVolume) bool {
		return dv.Status.Phase == cdiv1.UploadReady || dv.Status.Phase == cdiv1.Failed
	})
	if dv.Status.Phase != cdiv1.UploadReady {
		t.Fatalf("DataVolume %s/%s is %s before the upload, not UploadReady; phases %v", ns, name, dv.Status.Phase, seen)
	}
	return dv, seen
}

// uploadTarget waits for an upload DataVolume's server to be ready and
// returns its address, a client with the proxy's certificate, and the
// phases seen.
func uploadTarget(t *testing.T, c client.Client, installNS, ns, name string) (base string, hc *http.Client, seen []string) {
	t.Helper()
	_, seen = waitUploadReady(t, c, ns, name)
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, pvc); err != nil {
		t.Fatal(err)
	}
	primeName := pvc.Annotations[cdiv1.AnnPVCPrimeName]
	podName := populators.UploadPodName(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: primeName}})
	pod := &corev1.Pod{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: podName}, pod); err != nil {
		t.Fatalf("upload pod: %v", err)
	}
	return "https://" + net.JoinHostPort(pod.Status.PodIP, fmt.Sprint(populators.UploadServerPort)),
		uploadClient(t, c, installNS, cdiv1.UploadServiceHost(ns, primeName)), seen
}

// TestUploadSurvivesKilledConnection: an upload whose connection dies
// halfway leaves the DataVolume UploadReady; the retry succeeds and the
// claim holds the right bytes. (Block volumes are not covered here: the
// local cluster's CSI driver publishes them as regular files, not device
// nodes, so neither the importer nor the upload server sees a device.)
func TestUploadSurvivesKilledConnection(t *testing.T) {
	parallel(t)
	c, installNS := shared.c, shared.installNS
	ns := newNamespace(t)
	dir := t.TempDir()
	name, virtualSize, want := testImage(t, dir)
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	dv := kit.DataVolume(ns, "retried", kit.Upload(), kit.WithPVC(filesystemClaim("128Mi")))
	if err := c.Create(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	base, hc, _ := uploadTarget(t, c, installNS, ns, "retried")

	// Half the image, then the connection dies.
	tr := hc.Transport.(*http.Transport)
	conn, err := tls.Dial("tcp", strings.TrimPrefix(base, "https://"), tr.TLSClientConfig)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1beta1/upload HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", len(data))
	if _, err := conn.Write(data[:len(data)/2]); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	retryUpload(t, hc, base+"/v1beta1/upload", "", data, func() {
		// Still UploadReady meanwhile: the dead connection failed nothing.
		assertPhase(t, c, ns, "retried", cdiv1.UploadReady)
	})
	dv, seen := kit.WaitDataVolumeTerminal(t, c, ns, "retried", 3*time.Minute)
	t.Logf("after the retry: %v (restarts %d)", seen, dv.Status.RestartCount)
	if dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("DataVolume ended %s: %+v\nevents:\n%s", dv.Status.Phase, dv.Status.Conditions, eventsFor(ns, "retried"))
	}
	if got := claimSHA256(t, ns, "retried", virtualSize); got != want {
		t.Errorf("claim holds sha256 %s over %d bytes, qemu-img convert gives %s", got, virtualSize, want)
	}
}

// postUpload POSTs size bytes of body to url (an upload path), with the
// token when one is given, and returns the status and the answer's text.
func postUpload(hc *http.Client, url, tok string, body io.Reader, size int64) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		return 0, "", err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}

// mustUpload posts body and fails the test unless the answer is 200; it
// returns how long that took.
func mustUpload(t *testing.T, hc *http.Client, url string, body io.Reader, size int64) time.Duration {
	t.Helper()
	start := time.Now()
	code, text, err := postUpload(hc, url, "", body, size)
	if err != nil || code != http.StatusOK {
		t.Fatalf("upload: %d %s %v", code, text, err)
	}
	return time.Since(start)
}

// retryUpload posts data until it is accepted: after a killed connection the
// server may answer 503 for a moment, while it notices; busy runs on each.
func retryUpload(t *testing.T, hc *http.Client, url, tok string, data []byte, busy func()) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		code, text, err := postUpload(hc, url, tok, bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if code == http.StatusOK {
			return
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("retry: %d %s", code, text)
		}
		busy()
		time.Sleep(200 * time.Millisecond)
	}
}
