package integration

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/kit"
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
	kit.Until(t, 30*time.Second, "the manager to hold its leader-election Lease", func() bool {
		err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "kubefill-controller-test"}, lease)
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != ""
	})
	t.Logf("leader: %s", *lease.Spec.HolderIdentity)

	dv := kit.DataVolume(ns, "seen", kit.Blank(), kit.WithStorage("", "1Gi"))
	if err := k8sClient.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	cached := &cdiv1.DataVolume{}
	kit.Until(t, 10*time.Second, "the manager's cache to serve the DataVolume", func() bool {
		return mgr.GetClient().Get(ctx, types.NamespacedName{Namespace: ns, Name: "seen"}, cached) == nil
	})
	if cached.Spec.Source == nil || cached.Spec.Source.Blank == nil {
		t.Errorf("cached DataVolume lost its source: %+v", cached.Spec)
	}
}
