package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/kit"
)

// infraOf is what CDI.spec.infra, priorityClass and imagePullPolicy set on
// a Deployment, for comparing.
type infraOf struct {
	Replicas     int32
	NodeSelector map[string]string
	Affinity     *corev1.Affinity
	Tolerations  []corev1.Toleration
	Priority     string
	PullPolicies []corev1.PullPolicy
}

func readInfra(d *appsv1.Deployment) infraOf {
	pod := d.Spec.Template.Spec
	f := infraOf{Replicas: ptr.Deref(d.Spec.Replicas, 1), NodeSelector: pod.NodeSelector, Affinity: pod.Affinity, Tolerations: pod.Tolerations, Priority: pod.PriorityClassName}
	for _, c := range append(append([]corev1.Container(nil), pod.InitContainers...), pod.Containers...) {
		f.PullPolicies = append(f.PullPolicies, c.ImagePullPolicy)
	}
	return f
}

// TestCDIInfraPlacesTheInstallDeployments runs the controller as its
// ServiceAccount of manifests/install against the manifests' own three
// Deployments: the CDI resource's spec.infra, priorityClass and
// imagePullPolicy reach them, a reconcile with nothing new writes nothing,
// and the manifests' values come back when the resource stops setting them
// and when it is deleted. Serial: it applies the install's cluster-wide RBAC
// (on a control plane of its own).
func TestCDIInfraPlacesTheInstallDeployments(t *testing.T) {
	envCfg, envClient := startOwnControlPlane(t, ownEnvironment(t), "the CDI infra control plane")
	useControlPlane(t, envCfg, envClient)
	ctx := context.Background()
	if err := doApplyInstall(); err != nil {
		t.Fatalf("installing manifests/install's namespace and RBAC: %v", err)
	}
	objs, err := installObjects()
	if err != nil {
		t.Fatal(err)
	}
	manifest := map[string]infraOf{}
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		d := &appsv1.Deployment{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, d); err != nil {
			t.Fatal(err)
		}
		if err := k8sClient.Create(ctx, d); err != nil {
			t.Fatalf("creating the manifests' Deployment %s: %v", d.Name, err)
		}
		manifest[d.Name] = readInfra(d)
	}
	for _, name := range controller.InfraDeploymentNames {
		if _, ok := manifest[name]; !ok {
			t.Fatalf("manifests/install has no Deployment %s", name)
		}
	}
	mustCreate(t, k8sClient, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: cdiv1.DefaultInfraPriorityClass}, Value: 1000000000})

	rec := &forbiddenLog{}
	mgr, err := controller.NewManager(impersonating(controllerSA, rec), controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: installNamespace, Version: cdiTestVersion, SkipNameValidation: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { assertNoForbidden(t, "the controller's ServiceAccount", rec) })
	startUntilCleanup(t, mgr)

	infra := cdiv1.ComponentConfig{
		NodePlacement: cdiv1.NodePlacement{
			NodeSelector: map[string]string{"node-role.kubernetes.io/infra": ""},
			Tolerations:  []corev1.Toleration{{Key: "infra", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}},
		},
		DeploymentReplicas: ptr.To(int32(2)), APIServerReplicas: ptr.To(int32(3)), UploadProxyReplicas: ptr.To(int32(4)),
	}
	replicas := map[string]int32{controller.ControllerDeploymentName: 2, controller.APIServerDeploymentName: 3, controller.UploadProxyDeploymentName: 4}
	placed := func(name string) infraOf {
		want := manifest[name]
		want.Replicas, want.NodeSelector, want.Affinity, want.Tolerations = replicas[name], infra.NodeSelector, infra.Affinity, infra.Tolerations
		want.Priority = cdiv1.DefaultInfraPriorityClass
		want.PullPolicies = nil
		for range manifest[name].PullPolicies {
			want.PullPolicies = append(want.PullPolicies, corev1.PullNever)
		}
		return want
	}
	get := func(name string) *appsv1.Deployment {
		d := &appsv1.Deployment{}
		if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: installNamespace, Name: name}, d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	waitAll := func(what string, want func(name string) infraOf, saved bool) {
		t.Helper()
		for _, name := range controller.InfraDeploymentNames {
			var last infraOf
			kit.Until(t, 30*time.Second, "Deployment "+name+" "+what, func() bool {
				d := get(name)
				last = readInfra(d)
				_, has := d.Annotations[cdiv1.AnnManifestPlacement]
				return equality.Semantic.DeepEqual(last, want(name)) && has == saved
			})
		}
	}
	updateCDI := func(what string, change func(*cdiv1.CDI)) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cr := &cdiv1.CDI{}
			if err := k8sClient.Get(ctx, client.ObjectKey{Name: "cdi"}, cr); err != nil {
				return err
			}
			change(cr)
			return k8sClient.Update(ctx, cr)
		}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	// 1. Everything set: all three Deployments take it.
	mustCreate(t, k8sClient, &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}, Spec: cdiv1.CDISpec{Infra: *infra.DeepCopy(), ImagePullPolicy: corev1.PullNever}})
	t.Cleanup(func() { deleteCDIs(t) })
	waitAll("placed as spec.infra asks", placed, true)

	// 2. A reconcile with nothing new writes no Deployment.
	versions := map[string]string{}
	for _, name := range controller.InfraDeploymentNames {
		versions[name] = get(name).ResourceVersion
	}
	updateCDI("touching the CDI resource", func(cr *cdiv1.CDI) { metav1.SetMetaDataLabel(&cr.ObjectMeta, "touched", "1") })
	time.Sleep(2 * time.Second)
	for _, name := range controller.InfraDeploymentNames {
		if rv := get(name).ResourceVersion; rv != versions[name] {
			t.Errorf("Deployment %s was written (resourceVersion %s → %s) though nothing changed", name, versions[name], rv)
		}
	}

	// 3. A Deployment edited by hand is placed again.
	d := get(controller.UploadProxyDeploymentName)
	patch := client.MergeFrom(d.DeepCopy())
	d.Spec.Template.Spec.NodeSelector = map[string]string{"by": "hand"}
	if err := k8sClient.Patch(ctx, d, patch); err != nil {
		t.Fatal(err)
	}
	waitAll("placed again after a hand edit", placed, true)

	// 4. Nothing set, and a priority class that does not exist: the
	// manifests' values, and the saved copy goes.
	updateCDI("unsetting spec.infra", func(cr *cdiv1.CDI) {
		cr.Spec.Infra, cr.Spec.ImagePullPolicy = cdiv1.ComponentConfig{}, ""
		cr.Spec.PriorityClass = ptr.To(cdiv1.CDIPriorityClass("no-such-class"))
	})
	waitAll("back to the manifest", func(name string) infraOf { return manifest[name] }, false)

	// 5. Set again, then the resource deleted: the manifests' values again.
	updateCDI("setting spec.infra again", func(cr *cdiv1.CDI) {
		cr.Spec.Infra, cr.Spec.ImagePullPolicy, cr.Spec.PriorityClass = *infra.DeepCopy(), corev1.PullNever, nil
	})
	waitAll("placed again", placed, true)
	if err := k8sClient.Delete(ctx, &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}}); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 30*time.Second, "the CDI resource to be gone", func() bool {
		return gone(ctx, &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}})
	})
	waitAll("back to the manifest after the CDI resource's deletion", func(name string) infraOf { return manifest[name] }, false)
	if t.Failed() {
		for _, name := range controller.InfraDeploymentNames {
			t.Logf("Deployment %s: %s", name, fmt.Sprintf("%+v", readInfra(get(name))))
		}
	}
}
