package integration

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
)

// TestControllerManagerRuns starts `kubefill controller`'s manager against the
// real apiserver: it must win leader election (a real Lease) and its cache
// must serve our CRD types.
func TestControllerManagerRuns(t *testing.T) {
	ns := newNamespace(t)
	mgr := runManager(t, controller.ManagerOptions{
		MetricsBindAddress:     "0",
		HealthProbeBindAddress: "127.0.0.1:0",
		LeaderElection:         true,
		LeaderElectionID:       "kubefill-controller-test",
		LeaderElectionNS:       ns,
	})
	ctx := context.Background()

	lease := &coordinationv1.Lease{}
	waitFor(t, 30*time.Second, "the manager to hold its leader-election Lease", func() bool {
		err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "kubefill-controller-test"}, lease)
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != ""
	})
	t.Logf("leader: %s", *lease.Spec.HolderIdentity)

	dv := &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "seen", Namespace: ns},
		Spec: cdiv1.DataVolumeSpec{
			Source:  &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}},
			Storage: &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		},
	}
	if err := k8sClient.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	cached := &cdiv1.DataVolume{}
	waitFor(t, 10*time.Second, "the manager's cache to serve the DataVolume", func() bool {
		return mgr.GetClient().Get(ctx, types.NamespacedName{Namespace: ns, Name: "seen"}, cached) == nil
	})
	if cached.Spec.Source == nil || cached.Spec.Source.Blank == nil {
		t.Errorf("cached DataVolume lost its source: %+v", cached.Spec)
	}
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
