package integration

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
)

// TestCloneDataVolumeInheritsInstancetypeLabels: as in CDI, a clone
// DataVolume without default instancetype or preference labels takes them
// from its source claim, or from the DataSource its sourceRef names, and
// its claim carries them (KubeVirt infers a VM's instancetype from them);
// one that chose a label keeps its own and takes none. No other label of
// the source is taken.
func TestCloneDataVolumeInheritsInstancetypeLabels(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns, installNS := newNamespace(t), newNamespace(t)
	class := ns + "-csi"
	cloneClass(t, class)
	sharedClusterControllers(t)
	runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: installNS, Namespaces: []string{ns}})

	golden := boundSource(t, ns, "golden", class, "1Gi")
	golden.Labels = map[string]string{cdiv1.LabelDefaultInstancetype: "u1.small", cdiv1.LabelDefaultPreference: "fedora", "app": "golden"}
	if err := k8sClient.Update(ctx, golden); err != nil {
		t.Fatal(err)
	}
	// The DataSource's claim has none of them: the DataSource controller
	// copies a claim's onto the DataSource, and these are the DataSource's own.
	boundSource(t, ns, "plain", class, "1Gi")
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fedora",
		Labels: map[string]string{cdiv1.LabelDefaultInstancetype: "u1.medium", cdiv1.LabelDefaultPreferenceKind: "VirtualMachineClusterPreference"}},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: "plain"}}}}
	mustCreate(t, k8sClient, ds)

	fromPVC := cloneDataVolume(ns, "from-pvc", class, pvcSource(ns, "golden"), nil, nil)
	fromDS := cloneDataVolume(ns, "from-ds", class, nil, &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: "fedora"}, nil)
	chosen := cloneDataVolume(ns, "chosen", class, pvcSource(ns, "golden"), nil, nil)
	chosen.Labels = map[string]string{cdiv1.LabelDefaultPreference: "rhel.9"}
	for _, dv := range []*cdiv1.DataVolume{fromPVC, fromDS, chosen} {
		mustCreate(t, k8sClient, dv)
	}
	cases := []struct {
		dv   *cdiv1.DataVolume
		want map[string]string
	}{
		{fromPVC, map[string]string{cdiv1.LabelDefaultInstancetype: "u1.small", cdiv1.LabelDefaultPreference: "fedora"}},
		{fromDS, map[string]string{cdiv1.LabelDefaultInstancetype: "u1.medium", cdiv1.LabelDefaultPreferenceKind: "VirtualMachineClusterPreference"}},
		{chosen, map[string]string{cdiv1.LabelDefaultPreference: "rhel.9"}},
	}
	for _, c := range cases {
		pvc := waitClaim(t, ns, c.dv.Name, nil)
		dv := &cdiv1.DataVolume{}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(c.dv), dv); err != nil {
			t.Fatal(err)
		}
		for what, labels := range map[string]map[string]string{"DataVolume": dv.Labels, "claim": pvc.Labels} {
			if got := instancetypeLabelsOf(labels); !equalLabels(got, c.want) {
				t.Errorf("%s %s: instancetype labels %v, want %v", what, c.dv.Name, got, c.want)
			}
			if labels["app"] == "golden" {
				t.Errorf("%s %s took a label other than the instancetype defaults: %v", what, c.dv.Name, labels)
			}
		}
	}
}

func instancetypeLabelsOf(labels map[string]string) map[string]string {
	out := map[string]string{}
	for _, k := range []string{cdiv1.LabelDefaultInstancetype, cdiv1.LabelDefaultInstancetypeKind, cdiv1.LabelDefaultPreference, cdiv1.LabelDefaultPreferenceKind} {
		if v, ok := labels[k]; ok {
			out[k] = v
		}
	}
	return out
}

func equalLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}
