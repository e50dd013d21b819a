package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/pkg/uploadcli"
	"github.com/kubefill/kubefill/tests/kit"
)

// TestUploadCLIEndToEnd runs `kubefill upload pvc` (uploadcli.Runner) for
// real: it reads the proxy URL from CDIConfig, creates the PVC and its
// VolumeUploadSource, waits for storage.pod.ready through the prime, gets a
// token through kube-apiserver's aggregator from `kubefill apiserver`, and
// streams the file through `kubefill uploadproxy` into a real upload server.
// The test plays the upload populator (no controller or kubelet here).
func TestUploadCLIEndToEnd(t *testing.T) {
	t.Parallel()
	e := startAggEnv(t)
	installNS := serveTokenAPI(t, e, 90*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := e.namespace(t, "cli-upload-")
	const prime = "prime-cli"
	pub, err := token.EncodePublicKeyPEM(e.serverKeys(t, installNS).Current)
	if err != nil {
		t.Fatal(err)
	}
	rig := startUploadRig(t, ctx, e.cfg, ns, prime, pub)

	override := rig.proxyURL
	cdiConfig := &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: "config"}, Spec: cdiv1.CDIConfigSpec{UploadProxyURLOverride: &override}}
	mustCreate(t, e.client, cdiConfig)
	t.Cleanup(func() { _ = e.client.Delete(context.Background(), cdiConfig) })

	image := make([]byte, 5<<20+123)
	if _, err := rand.Read(image); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(file, image, 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r, err := uploadcli.NewRunner(e.cfg, uploadcli.Options{
		Kind: uploadcli.KindPVC, Name: "disk", Namespace: ns, ImagePath: file, Size: "8Mi",
		CACert: rig.proxyCA, WaitSecs: 60, Retry: 2,
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	r.Poll = 200 * time.Millisecond
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()

	// The populator's part: once the CLI created the claim, make its prime and upload pod.
	var target corev1.PersistentVolumeClaim
	kit.Until(t, 30*time.Second, "the CLI to create the PVC", func() bool {
		return e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "disk"}, &target) == nil
	})
	ref := target.Spec.DataSourceRef
	if ref == nil || ref.Kind != cdiv1.VolumeUploadSourceRef || ref.Name != "disk" {
		t.Fatalf("the CLI's PVC has dataSourceRef %+v", ref)
	}
	var src cdiv1.VolumeUploadSource
	if err := e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "disk"}, &src); err != nil {
		t.Fatalf("the CLI's VolumeUploadSource: %v", err)
	}
	playUploadPopulator(t, ctx, e.client, &target, prime, time.Second)
	select {
	case <-rig.us.Done():
	case err := <-runErr:
		t.Fatalf("the CLI ended before the upload server finished: %v\n%s", err, out.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("the upload server did not finish\n%s", out.String())
	}
	// The populator hands the volume over and records the outcome on the claim.
	patchAnnotations(t, e.client, &target, map[string]string{cdiv1.AnnPodPhase: string(corev1.PodSucceeded)})
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("kubefill upload: %v\n%s", err, out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the CLI did not finish\n%s", out.String())
	}
	t.Logf("kubefill upload pvc took %s; its output:\n%s", time.Since(start).Round(time.Millisecond), out.String())

	got, err := os.ReadFile(filepath.Join(rig.volume, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < len(image) || !bytes.Equal(got[:len(image)], image) {
		t.Fatalf("the volume holds %d bytes that do not start with the %d uploaded", len(got), len(image))
	}
	for _, want := range []string{"PersistentVolumeClaim " + ns + "/disk created", rig.proxyURL + "/v1beta1/upload-async", "uploaded 5243003 bytes", "is populated"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the CLI's output lacks %q", want)
		}
	}

	// A second run into the same claim is refused before any byte is sent.
	r2, _ := uploadcli.NewRunner(e.cfg, uploadcli.Options{Kind: uploadcli.KindPVC, Name: "disk", Namespace: ns, ImagePath: file, NoCreate: true, CACert: rig.proxyCA, WaitSecs: 5}, &bytes.Buffer{})
	if err := r2.Run(ctx); err == nil || !strings.Contains(err.Error(), "already received its upload") {
		t.Errorf("second upload into a populated claim: %v", err)
	}
	// Creating over an existing claim is refused with a hint.
	r3, _ := uploadcli.NewRunner(e.cfg, uploadcli.Options{Kind: uploadcli.KindPVC, Name: "disk", Namespace: ns, ImagePath: file, Size: "8Mi", CACert: rig.proxyCA, WaitSecs: 5}, &bytes.Buffer{})
	if err := r3.Run(ctx); err == nil || !strings.Contains(err.Error(), "--no-create") {
		t.Errorf("creating over an existing claim: %v", err)
	}
}
