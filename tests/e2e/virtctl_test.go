package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// virtctlCLI runs KubeVirt's real virtctl as a user would, with the
// cluster's admin kubeconfig, and returns its combined output.
func virtctlCLI(t *testing.T, bin string, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(testContext(t, timeout), bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cl.Kubeconfig)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// virtctlLines drops the progress bar's redraws (carriage returns) so the
// log keeps what virtctl said.
func virtctlLines(out string) string {
	var keep []string
	for _, line := range strings.Split(out, "\n") {
		if i := strings.LastIndex(line, "\r"); i >= 0 {
			line = line[i+1:]
		}
		if strings.TrimSpace(line) != "" {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

func requireOutput(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("virtctl's output lacks %q", want)
		}
	}
}

func assertSucceeded(t *testing.T, ns, name string, s *uploadStack) *cdiv1.DataVolume {
	t.Helper()
	dv := &cdiv1.DataVolume{}
	if err := s.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, dv); err != nil {
		t.Fatal(err)
	}
	if dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("DataVolume %s/%s is %s %s after virtctl returned", ns, name, dv.Status.Phase, dv.Status.Progress)
	}
	return dv
}

// assertClaimBytes checks that a Filesystem claim's disk.img holds what
// qemu-img converts the uploaded image to.
func assertClaimBytes(t *testing.T, ns, claim string, n int64, want string) {
	t.Helper()
	if got := claimSHA256(t, ns, claim, n); got != want {
		t.Errorf("claim %s holds sha256 %s over %d bytes, qemu-img convert gives %s", claim, got, n, want)
	} else {
		t.Logf("claim %s holds the %d bytes qemu-img converts the image to (sha256 %s)", claim, n, got)
	}
}

// TestVirtctlImageUpload runs KubeVirt's own `virtctl image-upload`, built
// from kubevirt.io/kubevirt by hack/virtctl.sh, against Kubefill on the local
// cluster: the proxy is found in CDIConfig or given with --uploadproxy-url,
// the token comes through the aggregated API, the data goes through
// `kubefill uploadproxy`, and virtctl's own completion check (the claim's
// cdi.kubevirt.io/storage.pod.phase) must end it with exit code 0.
func TestVirtctlImageUpload(t *testing.T) {
	bin, err := cluster.VirtctlBinary()
	if err != nil {
		t.Fatalf("no virtctl: %v\nbuild it with `bash hack/virtctl.sh` (a few minutes, cached) or set KUBEFILL_VIRTCTL", err)
	}
	if out, err := virtctlCLI(t, bin, time.Minute, "version", "--client"); err != nil {
		t.Fatalf("virtctl version --client: %v\n%s", err, out)
	} else {
		t.Logf("%s: %s", bin, strings.TrimSpace(out))
	}
	s := sharedUploads()
	dir := t.TempDir()
	name, virtualSize, want := testImage(t, dir)
	image := filepath.Join(dir, name)

	// The URL virtctl finds on its own: CDIConfig's status.uploadProxyURL.
	// Our proxy's CA is in no system pool, hence --insecure.
	t.Run("dv/url-from-cdiconfig", func(t *testing.T) {
		ns := newNamespace(t)
		start := time.Now()
		out, err := virtctlCLI(t, bin, 4*time.Minute, "image-upload", "dv", "vm-disk", "--namespace="+ns,
			"--size=128Mi", "--image-path="+image, "--insecure", "--wait-secs=180")
		t.Logf("virtctl image-upload dv took %s; its output:\n%s", time.Since(start).Round(time.Millisecond), virtctlLines(out))
		if err != nil {
			t.Fatalf("virtctl image-upload dv: %v\nevents:\n%s", err, eventsFor(ns, "vm-disk"))
		}
		requireOutput(t, out, "DataVolume "+ns+"/vm-disk created", "Uploading data to "+s.svc.ProxyURL,
			"Processing completed successfully", "Uploading "+image+" completed successfully")
		assertSucceeded(t, ns, "vm-disk", s)
		assertClaimBytes(t, ns, "vm-disk", virtualSize, want)
	})

	// Through the proxy's Service, as a cluster publishes it: virtctl dials
	// the cdi-uploadproxy ClusterIP and kube-proxy's rules take it to the
	// proxy, whose certificate names the ClusterIP (checked first with the
	// proxy's CA, since virtctl has no CA flag).
	t.Run("dv/service-clusterip", func(t *testing.T) {
		if s.svc.ServiceURL == "" {
			t.Fatal("the upload proxy has no Service URL (no real node?)")
		}
		resp, err := s.proxyClient(t).Get(s.svc.ServiceURL + "/healthz")
		if err != nil {
			t.Fatalf("GET %s/healthz with the proxy's CA: %v", s.svc.ServiceURL, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s/healthz: %s", s.svc.ServiceURL, resp.Status)
		}
		ns := newNamespace(t)
		out, err := virtctlCLI(t, bin, 4*time.Minute, "image-upload", "dv", "via-service", "--namespace="+ns,
			"--size=128Mi", "--image-path="+image, "--uploadproxy-url="+s.svc.ServiceURL, "--insecure", "--wait-secs=180")
		t.Logf("virtctl image-upload dv through %s:\n%s", s.svc.ServiceURL, virtctlLines(out))
		if err != nil {
			t.Fatalf("virtctl image-upload dv through the Service: %v\nevents:\n%s", err, eventsFor(ns, "via-service"))
		}
		requireOutput(t, out, "Uploading data to "+s.svc.ServiceURL, "Processing completed successfully")
		assertSucceeded(t, ns, "via-service", s)
		assertClaimBytes(t, ns, "via-service", virtualSize, want)
	})

	// An existing DataVolume: virtctl follows the claim's
	// storage.populator.pvcPrime to the prime and checks it is an upload
	// target before it asks for a token.
	t.Run("dv/no-create", func(t *testing.T) {
		ns := newNamespace(t)
		dv := kit.DataVolume(ns, "existing", kit.Upload(), kit.WithStorage("", "128Mi"))
		if err := s.c.Create(context.Background(), dv); err != nil {
			t.Fatal(err)
		}
		waitUploadReady(t, s.c, ns, "existing")
		out, err := virtctlCLI(t, bin, 4*time.Minute, "image-upload", "dv", "existing", "--namespace="+ns, "--no-create",
			"--image-path="+image, "--uploadproxy-url="+s.svc.ProxyURL, "--insecure", "--wait-secs=180")
		t.Logf("virtctl image-upload dv --no-create:\n%s", virtctlLines(out))
		if err != nil {
			t.Fatalf("virtctl image-upload dv --no-create: %v\nevents:\n%s", err, eventsFor(ns, "existing"))
		}
		requireOutput(t, out, "Using existing PVC "+ns+"/", "Processing completed successfully")
		assertSucceeded(t, ns, "existing", s)
		assertClaimBytes(t, ns, "existing", virtualSize, want)
	})

	// virtctl sends an archive to the same upload-async path as an image;
	// only the DataVolume's contentType says it is a tar.
	t.Run("dv/archive", func(t *testing.T) {
		ns := newNamespace(t)
		blob := make([]byte, 1<<20+3)
		if _, err := rand.Read(blob); err != nil {
			t.Fatal(err)
		}
		files := map[string][]byte{"blob.bin": blob, "etc/motd": []byte("uploaded by virtctl\n")}
		archive := filepath.Join(t.TempDir(), "data.tar")
		writeTar(t, archive, files)
		out, err := virtctlCLI(t, bin, 4*time.Minute, "image-upload", "dv", "appdata", "--namespace="+ns, "--size=64Mi",
			"--archive-path="+archive, "--uploadproxy-url="+s.svc.ProxyURL, "--insecure", "--wait-secs=180")
		t.Logf("virtctl image-upload dv --archive-path:\n%s", virtctlLines(out))
		if err != nil {
			t.Fatalf("virtctl image-upload dv --archive-path: %v\nevents:\n%s", err, eventsFor(ns, "appdata"))
		}
		dv := assertSucceeded(t, ns, "appdata", s)
		if dv.Spec.ContentType != cdiv1.DataVolumeArchive {
			t.Errorf("virtctl made a DataVolume with contentType %q", dv.Spec.ContentType)
		}
		got := runToCompletion(t, ns, podWithClaim("list-appdata", "appdata", false,
			"cd /data && sha256sum blob.bin etc/motd > /dev/termination-log"))
		for name, data := range files {
			sum := sha256.Sum256(data)
			if line := hex.EncodeToString(sum[:]) + "  " + name; !strings.Contains(got, line) {
				t.Errorf("the volume lacks %s with its contents; the pod saw:\n%s", name, got)
			}
		}
	})

	// A WaitForFirstConsumer class without --force-bind: virtctl refuses a
	// DataVolume that reports WaitForFirstConsumer or PendingPopulation, and
	// Kubefill binds an upload target at once (its upload pod is the first
	// consumer), so the upload goes through.
	t.Run("dv/wffc-class", func(t *testing.T) {
		ns := newNamespace(t)
		out, err := virtctlCLI(t, bin, 4*time.Minute, "image-upload", "dv", "late", "--namespace="+ns, "--size=128Mi",
			"--storage-class="+cluster.StorageClassWFFC, "--volume-mode=filesystem",
			"--image-path="+image, "--uploadproxy-url="+s.svc.ProxyURL, "--insecure", "--wait-secs=180")
		t.Logf("virtctl image-upload dv --storage-class=%s:\n%s", cluster.StorageClassWFFC, virtctlLines(out))
		if err != nil {
			t.Fatalf("virtctl image-upload dv --storage-class=%s: %v\nevents:\n%s", cluster.StorageClassWFFC, err, eventsFor(ns, "late"))
		}
		assertSucceeded(t, ns, "late", s)
		assertClaimBytes(t, ns, "late", virtualSize, want)
	})

	// `image-upload pvc` creates a bare PVC annotated
	// cdi.kubevirt.io/storage.upload.target (and storage.contentType, label
	// cdi.kubevirt.io/applyStorageProfile), with no DataVolume and no
	// dataSourceRef, then waits for storage.pod.ready on that PVC itself, and
	// after the upload for storage.pod.phase=Succeeded. Kubefill's
	// upload-target controller fills such a PVC in place, as CDI does.
	t.Run("pvc", func(t *testing.T) {
		ns := newNamespace(t)
		out, err := virtctlCLI(t, bin, 4*time.Minute, "image-upload", "pvc", "bare", "--namespace="+ns, "--size=128Mi",
			"--image-path="+image, "--uploadproxy-url="+s.svc.ProxyURL, "--insecure", "--wait-secs=120")
		t.Logf("virtctl image-upload pvc:\n%s", virtctlLines(out))
		pvc, gerr := cl.Client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), "bare", metav1.GetOptions{})
		if gerr != nil {
			t.Fatalf("virtctl image-upload pvc (%v) left no PVC: %v", err, gerr)
		}
		t.Logf("the PVC virtctl made: annotations %v, labels %v, dataSourceRef %v, phase %s",
			pvc.Annotations, pvc.Labels, pvc.Spec.DataSourceRef, pvc.Status.Phase)
		if err != nil {
			t.Fatalf("virtctl image-upload pvc: %v\nevents:\n%s", err, eventsFor(ns, "bare"))
		}
		if pvc.Annotations[cdiv1.AnnPodPhase] != string(corev1.PodSucceeded) {
			t.Errorf("the PVC's %s is %q after virtctl returned", cdiv1.AnnPodPhase, pvc.Annotations[cdiv1.AnnPodPhase])
		}
		requireOutput(t, out, "PersistentVolumeClaim "+ns+"/bare created", "Processing completed successfully")
		kit.Until(t, time.Minute, "the upload pod cdi-upload-bare and its Service to go", func() bool {
			_, perr := cl.Client.CoreV1().Pods(ns).Get(context.Background(), "cdi-upload-bare", metav1.GetOptions{})
			_, serr := cl.Client.CoreV1().Services(ns).Get(context.Background(), "cdi-upload-bare", metav1.GetOptions{})
			return apierrors.IsNotFound(perr) && apierrors.IsNotFound(serr)
		})
		assertClaimBytes(t, ns, "bare", virtualSize, want)
	})
}
