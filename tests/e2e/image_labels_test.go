package e2e

import (
	"context"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/internal/registry"
	"github.com/kubefill/kubefill/tests/kit"
	"time"
)

// TestContainerdiskLabelsReachTheClaim: a containerdisk whose image sets
// INSTANCETYPE_KUBEVIRT_IO_* variables (as KubeVirt's containerdisks do)
// gives the claim it is imported into CDI's labels for them, which
// KubeVirt's instancetype inference reads; a label the DataVolume set
// itself is kept, and variables outside kubevirt.io become no label.
func TestContainerdiskLabelsReachTheClaim(t *testing.T) {
	parallel(t)
	needRealNode(t)
	c := shared.c
	ns := newNamespace(t)
	gw, err := cl.GatewayAddress()
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.Start(t, registry.Options{Address: gw, TLS: true})
	disk := make([]byte, 1<<20)
	img, err := mutate.Config(registry.DiskImage(t, "disk.img", disk), v1.Config{Env: []string{
		"INSTANCETYPE_KUBEVIRT_IO_DEFAULT_INSTANCETYPE=u1.small",
		"INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=fedora",
		"PATH=/usr/bin",
	}})
	if err != nil {
		t.Fatal(err)
	}
	const repo = "containerdisks/fedora:41"
	reg.Push(t, repo, img)
	ca := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "registry-ca"}, Data: map[string]string{"ca.crt": string(reg.CAPEM)}}
	if err := c.Create(context.Background(), ca); err != nil {
		t.Fatal(err)
	}
	url := reg.URL(repo)
	dv := kit.DataVolume(ns, "fedora", &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: &url, CertConfigMap: &ca.Name}},
		kit.WithPVC(kit.ClaimSpec("64Mi", kit.Class(cluster.StorageClassImmediate), kit.Mode(corev1.PersistentVolumeFilesystem))))
	dv.Labels = map[string]string{cdiv1.LabelDefaultPreference: "fedora.chosen"}
	if err := c.Create(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	got, seen := kit.WaitDataVolumeTerminal(t, c, ns, dv.Name, 3*time.Minute)
	if got.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("the import ended %s (%v): %s", got.Status.Phase, seen, runningCondition(got).Message)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: dv.Name}, pvc); err != nil {
		t.Fatal(err)
	}
	t.Logf("claim labels: %v", pvc.Labels)
	if v := pvc.Labels[cdiv1.LabelDefaultInstancetype]; v != "u1.small" {
		t.Errorf("the claim's %s is %q, want the image's u1.small", cdiv1.LabelDefaultInstancetype, v)
	}
	if v := pvc.Labels[cdiv1.LabelDefaultPreference]; v != "fedora.chosen" {
		t.Errorf("the claim's %s is %q, want the DataVolume's own fedora.chosen", cdiv1.LabelDefaultPreference, v)
	}
	for k := range pvc.Labels {
		if k == "path" || k == "kubevirt.io/path" {
			t.Errorf("a variable outside kubevirt.io became label %s", k)
		}
	}
}
