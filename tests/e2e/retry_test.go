package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/internal/registry"
	"github.com/kubefill/kubefill/tests/kit"
)

// failedAttemptsBeforeServing is one more failure than the three retries
// an import once gave up after: the import must outlast it, as CDI's does.
const failedAttemptsBeforeServing = 4

// TestFailingImportKeepsRetrying: a registry that answers 503 keeps the
// import retrying as CDI's importer restarts: the DataVolume stays
// ImportInProgress, its Running condition is False with reason
// ImagePullFailed and the last failure's message (what KubeVirt shows as
// DataVolumeError), its restartCount grows past the old bound of three and
// the controller's kubevirt_cdi_datavolume_high_restart counts it (the
// series CDIDataVolumeUnusualRestartCount reads); once the registry serves
// again the import ends Succeeded with the image's disk.
func TestFailingImportKeepsRetrying(t *testing.T) {
	parallel(t)
	needRealNode(t)
	c := shared.c
	ns := newNamespace(t)
	gw, err := cl.GatewayAddress()
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.Start(t, registry.Options{Address: gw, TLS: true})
	disk := make([]byte, 4<<20)
	for i := range disk {
		disk[i] = byte(i*7 + i>>10)
	}
	const repo = "containerdisks/flaky:latest"
	reg.PushDisk(t, repo, disk)
	ca := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "registry-ca"}, Data: map[string]string{"ca.crt": string(reg.CAPEM)}}
	if err := c.Create(context.Background(), ca); err != nil {
		t.Fatal(err)
	}
	reg.SetUnavailable(true)

	url := reg.URL(repo)
	src := &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: &url, CertConfigMap: &ca.Name}}
	dv := kit.DataVolume(ns, "flaky", src, kit.WithPVC(kit.ClaimSpec("128Mi", kit.Class(cluster.StorageClassImmediate), kit.Mode(corev1.PersistentVolumeFilesystem))))
	if err := c.Create(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	var failing cdiv1.DataVolumeCondition
	got, seen := kit.WaitDataVolume(t, c, ns, dv.Name, 5*time.Minute, func(dv *cdiv1.DataVolume) bool {
		if r := runningCondition(dv); r.Status == corev1.ConditionFalse && r.Reason == cdiv1.ReasonImagePullFailed {
			failing = r
		}
		return dv.Status.Phase == cdiv1.Failed || dv.Status.RestartCount >= failedAttemptsBeforeServing
	})
	t.Logf("after %d refused requests: phases %v; restartCount %d; last Running=False ImagePullFailed: %q", reg.Refused(), seen, got.Status.RestartCount, failing.Message)
	if got.Status.Phase == cdiv1.Failed {
		t.Fatalf("the import gave up on a transient failure: %s\nevents:\n%s", runningCondition(got).Message, kit.Events(c, ns, dv.Name))
	}
	if reg.Refused() == 0 {
		t.Fatal("the registry refused nothing: the test proves nothing")
	}
	if got.Status.Phase != cdiv1.ImportInProgress && got.Status.Phase != cdiv1.ImportScheduled {
		t.Errorf("while it fails the DataVolume is %s, want it still importing as CDI shows it", got.Status.Phase)
	}
	if !contains(failing.Message, "failed to pull image", "503", "retrying") {
		t.Errorf("the Running condition was never False/ImagePullFailed with the failure and its retry; last seen %q", failing.Message)
	}
	if n := highRestartGauge(t, "import"); n < 1 {
		t.Errorf("kubevirt_cdi_datavolume_high_restart{kind=import} is %v with a DataVolume at %d restarts", n, got.Status.RestartCount)
	}

	reg.SetUnavailable(false)
	got, seen = kit.WaitDataVolumeTerminal(t, c, ns, dv.Name, 6*time.Minute)
	t.Logf("once the registry serves: phases %v; restartCount %d", seen, got.Status.RestartCount)
	if got.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("the import ended %s once the registry served: %s\nevents:\n%s", got.Status.Phase, runningCondition(got).Message, kit.Events(c, ns, dv.Name))
	}
	if got.Status.RestartCount < failedAttemptsBeforeServing {
		t.Errorf("restartCount %d after %d failed attempts", got.Status.RestartCount, failedAttemptsBeforeServing)
	}
	if sum, want := claimSHA256(t, ns, dv.Name, int64(len(disk))), sha256Hex(disk); sum != want {
		t.Errorf("the claim holds sha256 %s, the image's disk is %s", sum, want)
	}
}

// highRestartGauge reads kubevirt_cdi_datavolume_high_restart{kind} from
// the registry the suite's controller registered its collectors in.
func highRestartGauge(t *testing.T, kind string) float64 {
	t.Helper()
	fams, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "kubevirt_cdi_datavolume_high_restart" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatal("the controller exports no kubevirt_cdi_datavolume_high_restart")
	return 0
}

// contains reports whether s holds every one of parts.
func contains(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
