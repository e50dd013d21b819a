package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// retainedImporter imports a small raw image into ns with the DataVolume
// annotations ann, keeping the importer pod, and returns that pod as the
// kubelet ran it.
func retainedImporter(t *testing.T, ns string, ann map[string]string) *corev1.Pod {
	t.Helper()
	c := shared.c
	dir := t.TempDir()
	dv := httpDV(ns, "disk", imageServer(t, dir)+"/"+rawImage(t, dir, 1<<20), cluster.StorageClassImmediate)
	dv.Annotations = map[string]string{cdiv1.AnnPodRetainAfterCompletion: "true"}
	for k, v := range ann {
		dv.Annotations[k] = v
	}
	if err := c.Create(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	got, seen := kit.WaitDataVolumeTerminal(t, c, ns, dv.Name, 4*time.Minute)
	if got.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("DataVolume ended %s (phases %v): %+v\nevents:\n%s", got.Status.Phase, seen, got.Status.Conditions, eventsFor(ns, dv.Name))
	}
	pods := &corev1.PodList{}
	if err := c.List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels{cdiv1.LabelComponent: "importer"}); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d importer pods retained, want 1", len(pods.Items))
	}
	return &pods.Items[0]
}

// TestImporterPodCarriesNetworkAndMeshAnnotations: a DataVolume's Multus
// annotations and its Linkerd choice reach the importer pod the kubelet
// runs, which stays out of Istio, where the user said nothing; the import
// succeeds (the node has no Multus, which would read them).
func TestImporterPodCarriesNetworkAndMeshAnnotations(t *testing.T) {
	parallel(t)
	ns := newNamespace(t)
	pod := retainedImporter(t, ns, map[string]string{cdiv1.AnnPodNetwork: "storage-net", cdiv1.AnnPodMultusDefaultNetwork: ns + "/primary",
		cdiv1.AnnPodSidecarInjectionLinkerd: "enabled"})
	for key, want := range map[string]string{cdiv1.AnnPodNetwork: "storage-net", cdiv1.AnnPodMultusDefaultNetwork: ns + "/primary",
		cdiv1.AnnPodSidecarInjectionLinkerd: "enabled", cdiv1.AnnPodSidecarInjectionIstio: "false"} {
		if got := pod.Annotations[key]; got != want {
			t.Errorf("importer pod %s = %q, want %q", key, got, want)
		}
	}
}

// TestImporterPodPlacedByTheCDIResource: with the CDI resource's
// spec.workload selecting the real node (and tolerating a taint it does not
// have) and its spec.config, which it makes CDIConfig's spec
// (configAuthority), naming a pull secret, the importer pod the kubelet
// runs has both, is scheduled on that node, and imports.
func TestImporterPodPlacedByTheCDIResource(t *testing.T) {
	needRealNode(t)
	ctx := context.Background()
	c := shared.c
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: cl.NodeName}, node); err != nil {
		t.Fatal(err)
	}
	hostname := node.Labels[corev1.LabelHostname]
	if hostname == "" {
		t.Fatalf("node %s has no %s label", node.Name, corev1.LabelHostname)
	}
	toleration := corev1.Toleration{Key: "kubefill.test/dedicated", Operator: corev1.TolerationOpEqual, Value: "virt", Effect: corev1.TaintEffectNoSchedule}
	ns := newNamespace(t)
	pull := "e2e-pull"
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pull}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"registry.invalid":{"auth":"dTpw"}}}`)}}
	if err := c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	cdiUntilCleanup(t, c, cdiv1.NodePlacement{NodeSelector: map[string]string{corev1.LabelHostname: hostname}, Tolerations: []corev1.Toleration{toleration}},
		[]corev1.LocalObjectReference{{Name: pull}})

	pod := retainedImporter(t, ns, nil)
	if pod.Spec.NodeName != node.Name || pod.Spec.NodeSelector[corev1.LabelHostname] != hostname {
		t.Errorf("importer pod on node %q with nodeSelector %v, want %s selected by %s=%s", pod.Spec.NodeName, pod.Spec.NodeSelector, node.Name, corev1.LabelHostname, hostname)
	}
	tolerated := false
	for _, tol := range pod.Spec.Tolerations {
		tolerated = tolerated || tol.MatchToleration(&toleration)
	}
	if !tolerated {
		t.Errorf("importer pod tolerations %v lack the CDI resource's %v", pod.Spec.Tolerations, toleration)
	}
	if len(pod.Spec.ImagePullSecrets) != 1 || pod.Spec.ImagePullSecrets[0].Name != pull {
		t.Errorf("importer pod imagePullSecrets %v, want CDIConfig's %s", pod.Spec.ImagePullSecrets, pull)
	}
}

// cdiUntilCleanup creates the cluster's one CDI resource with workload
// and, through its spec.config (the CDIConfig's authority, as CDI's
// operator makes it), CDIConfig's spec with pull secrets, and waits until
// CDIConfig's status says so. When the test ends the CDI resource goes
// and CDIConfig's spec is put back as it was.
func cdiUntilCleanup(t *testing.T, c client.Client, workload cdiv1.NodePlacement, pull []corev1.LocalObjectReference) {
	t.Helper()
	ctx := context.Background()
	cdis := &cdiv1.CDIList{}
	if err := c.List(ctx, cdis); err != nil {
		t.Fatal(err)
	}
	if len(cdis.Items) > 0 {
		t.Fatalf("a CDI resource %s exists already; this test's would not be the active one", cdis.Items[0].Name)
	}
	key := client.ObjectKey{Name: cdiv1.CDIConfigName}
	old := &cdiv1.CDIConfig{}
	kit.Eventually(t, time.Minute, kit.Interval, "CDIConfig to exist", func() (bool, string, error) {
		err := c.Get(ctx, key, old)
		return err == nil, fmt.Sprint(err), nil
	})
	awaitPullSecrets := func(want []corev1.LocalObjectReference) {
		kit.Eventually(t, time.Minute, kit.Interval, fmt.Sprintf("CDIConfig status imagePullSecrets %v", want), func() (bool, string, error) {
			cur := &cdiv1.CDIConfig{}
			if err := c.Get(ctx, key, cur); err != nil {
				return false, "", err
			}
			return fmt.Sprint(cur.Status.ImagePullSecrets) == fmt.Sprint(want), fmt.Sprintf("status %v", cur.Status.ImagePullSecrets), nil
		})
	}
	config := old.Spec.DeepCopy()
	config.ImagePullSecrets = pull
	cdi := &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "kubefill-e2e-workload", Annotations: map[string]string{cdiv1.AnnConfigAuthority: ""}},
		Spec: cdiv1.CDISpec{Workloads: workload, Config: config}}
	if err := c.Create(ctx, cdi); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Gone before the next test: the clone planner reads the first CDI
		// resource listed, and while it exists it dictates CDIConfig's spec.
		if err := c.Delete(context.Background(), cdi); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting CDI %s: %v", cdi.Name, err)
			return
		}
		kit.Eventually(t, time.Minute, kit.Interval, "CDI "+cdi.Name+" to go", func() (bool, string, error) {
			err := c.Get(context.Background(), client.ObjectKeyFromObject(cdi), &cdiv1.CDI{})
			return apierrors.IsNotFound(err), fmt.Sprint(err), nil
		})
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := &cdiv1.CDIConfig{}
			if err := c.Get(context.Background(), key, cur); err != nil {
				return err
			}
			cur.Spec = old.Spec
			return c.Update(context.Background(), cur)
		})
		if err != nil {
			t.Errorf("restoring CDIConfig's spec: %v", err)
			return
		}
		awaitPullSecrets(old.Spec.ImagePullSecrets)
	})
	awaitPullSecrets(pull)
	// The controller reads the CDI resource from its cache.
	time.Sleep(2 * time.Second)
}
