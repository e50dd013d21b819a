package integration

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/kit"
)

// TestManagerLimitedToNamespaces runs two managers side by side, as the
// e2e tests that restart a controller do: one for every namespace but
// "own" (ExcludeNamespaces), one for "own" only (Namespaces). Each one's
// cache, from which its controllers work, holds the DataVolumes of its
// namespaces and none of the other's.
func TestManagerLimitedToNamespaces(t *testing.T) {
	own, other := newNamespace(t), newNamespace(t)
	wide := runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0", ExcludeNamespaces: []string{own}})
	narrow := runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0", Namespaces: []string{own}})
	ctx := context.Background()
	create := func(ns, name string) types.NamespacedName {
		if err := k8sClient.Create(ctx, kit.DataVolume(ns, name, kit.Blank(), kit.WithStorage("", "1Gi"))); err != nil {
			t.Fatal(err)
		}
		return types.NamespacedName{Namespace: ns, Name: name}
	}
	// Each manager's informer sees the DataVolumes in the order they were
	// made: once it holds the later one, it would hold the earlier one too.
	first, later := create(own, "first"), create(other, "later")
	kit.Until(t, 30*time.Second, "the cluster-wide manager's cache to hold "+later.String(), func() bool {
		return wide.GetClient().Get(ctx, later, &cdiv1.DataVolume{}) == nil
	})
	if err := wide.GetClient().Get(ctx, first, &cdiv1.DataVolume{}); err == nil {
		t.Errorf("the manager that leaves %s out holds its DataVolume %s", own, first)
	}
	before, after := create(other, "before"), create(own, "after")
	kit.Until(t, 30*time.Second, "the limited manager's cache to hold "+after.String(), func() bool {
		return narrow.GetClient().Get(ctx, after, &cdiv1.DataVolume{}) == nil
	})
	if err := narrow.GetClient().Get(ctx, before, &cdiv1.DataVolume{}); err == nil {
		t.Errorf("the manager limited to %s holds the DataVolume %s", own, before)
	} else {
		t.Logf("the manager limited to %s on %s: %v", own, before, err)
	}
	if err := narrow.GetClient().Get(ctx, first, &cdiv1.DataVolume{}); err != nil {
		t.Errorf("the manager limited to %s does not hold its DataVolume %s: %v", own, first, err)
	}
}
