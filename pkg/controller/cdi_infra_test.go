package controller

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// manifestDeployment is an install Deployment as the manifests make it,
// after the API server's defaulting.
func manifestDeployment(name string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kubefill-system", Name: name},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(1)), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			NodeSelector:   map[string]string{"kubernetes.io/os": "linux"},
			InitContainers: []corev1.Container{{Name: "init", ImagePullPolicy: corev1.PullIfNotPresent}},
			Containers:     []corev1.Container{{Name: "main", ImagePullPolicy: corev1.PullAlways}},
		}}},
	}
}

func TestPlaceDeployment(t *testing.T) {
	infraNode := map[string]string{"node-role.kubernetes.io/infra": ""}
	toleration := []corev1.Toleration{{Key: "infra", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	affinity := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}}
	full := InfraWant{
		Infra: cdiv1.ComponentConfig{NodePlacement: cdiv1.NodePlacement{NodeSelector: infraNode, Affinity: affinity, Tolerations: toleration},
			DeploymentReplicas: ptr.To(int32(2)), APIServerReplicas: ptr.To(int32(3)), UploadProxyReplicas: ptr.To(int32(4))},
		ImagePullPolicy: corev1.PullNever, PriorityClassName: "kubevirt-cluster-critical",
	}
	manifest := infraFieldsOf(manifestDeployment(ControllerDeploymentName))
	placed := func(name string, want InfraWant) *appsv1.Deployment {
		d, _, err := PlaceDeployment(manifestDeployment(name), want)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	type fields struct {
		Replicas    int32
		Selector    map[string]string
		Affinity    *corev1.Affinity
		Tolerations []corev1.Toleration
		Priority    string
		Pull        map[string]corev1.PullPolicy
	}
	manifestFields := fields{1, manifest.NodeSelector, nil, nil, "", manifest.ImagePullPolicies}
	cases := []struct {
		name        string
		deployment  *appsv1.Deployment
		want        InfraWant
		changed     bool
		fields      fields
		keepsSaved  bool
		wantErrText bool
	}{
		{"no CDI resource: the manifest stays, nothing to write", manifestDeployment(ControllerDeploymentName), InfraWant{}, false, manifestFields, false, false},
		{"everything set on the controller", manifestDeployment(ControllerDeploymentName), full, true,
			fields{2, infraNode, affinity, toleration, "kubevirt-cluster-critical", map[string]corev1.PullPolicy{"init": corev1.PullNever, "main": corev1.PullNever}}, true, false},
		{"the API server takes apiServerReplicas", manifestDeployment(APIServerDeploymentName), InfraWant{Infra: full.Infra}, true,
			fields{3, infraNode, affinity, toleration, "", manifest.ImagePullPolicies}, true, false},
		{"the upload proxy takes uploadProxyReplicas", manifestDeployment(UploadProxyDeploymentName), InfraWant{Infra: cdiv1.ComponentConfig{UploadProxyReplicas: ptr.To(int32(4))}}, true,
			fields{4, manifest.NodeSelector, nil, nil, "", manifest.ImagePullPolicies}, true, false},
		{"replicas below 1 keep the manifest's (CDI's floor is 1)", manifestDeployment(ControllerDeploymentName), InfraWant{Infra: cdiv1.ComponentConfig{DeploymentReplicas: ptr.To(int32(0))}}, false,
			manifestFields, false, false},
		{"only tolerations: the manifest's nodeSelector stays", manifestDeployment(ControllerDeploymentName), InfraWant{Infra: cdiv1.ComponentConfig{NodePlacement: cdiv1.NodePlacement{Tolerations: toleration}}}, true,
			fields{1, manifest.NodeSelector, nil, toleration, "", manifest.ImagePullPolicies}, true, false},
		{"already placed: nothing to write", placed(ControllerDeploymentName, full), full, false,
			fields{2, infraNode, affinity, toleration, "kubevirt-cluster-critical", map[string]corev1.PullPolicy{"init": corev1.PullNever, "main": corev1.PullNever}}, true, false},
		{"no longer set: the manifest's values come back and the copy goes", placed(ControllerDeploymentName, full), InfraWant{}, true, manifestFields, false, false},
		{"partly unset: the rest comes back", placed(ControllerDeploymentName, full), InfraWant{Infra: cdiv1.ComponentConfig{NodePlacement: cdiv1.NodePlacement{NodeSelector: infraNode}}}, true,
			fields{1, infraNode, nil, nil, "", manifest.ImagePullPolicies}, true, false},
		{"the priority class that did not resolve is left off", manifestDeployment(ControllerDeploymentName), InfraWant{ImagePullPolicy: corev1.PullIfNotPresent}, true,
			fields{1, manifest.NodeSelector, nil, nil, "", map[string]corev1.PullPolicy{"init": corev1.PullIfNotPresent, "main": corev1.PullIfNotPresent}}, true, false},
		{"a same-valued request writes nothing", manifestDeployment(ControllerDeploymentName), InfraWant{Infra: cdiv1.ComponentConfig{DeploymentReplicas: ptr.To(int32(1)),
			NodePlacement: cdiv1.NodePlacement{NodeSelector: map[string]string{"kubernetes.io/os": "linux"}}}}, false, manifestFields, false, false},
		{"a broken saved copy is an error", func() *appsv1.Deployment {
			d := manifestDeployment(ControllerDeploymentName)
			d.Annotations = map[string]string{cdiv1.AnnManifestPlacement: "{"}
			return d
		}(), full, false, fields{}, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := c.deployment.DeepCopy()
			got, changed, err := PlaceDeployment(c.deployment, c.want)
			if c.wantErrText {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(before, c.deployment) {
				t.Errorf("the input Deployment was modified")
			}
			if changed != c.changed {
				t.Errorf("changed %v, want %v", changed, c.changed)
			}
			pod := got.Spec.Template.Spec
			f := infraFieldsOf(got)
			gotFields := fields{ptr.Deref(got.Spec.Replicas, -1), pod.NodeSelector, pod.Affinity, pod.Tolerations, pod.PriorityClassName, f.ImagePullPolicies}
			if !equality.Semantic.DeepEqual(gotFields, c.fields) {
				t.Errorf("fields\n got %+v\nwant %+v", gotFields, c.fields)
			}
			if _, saved := got.Annotations[cdiv1.AnnManifestPlacement]; saved != c.keepsSaved {
				t.Errorf("annotation %s present %v, want %v", cdiv1.AnnManifestPlacement, saved, c.keepsSaved)
			}
			// Deciding again from the result writes nothing: no loop.
			if _, again, err := PlaceDeployment(got, c.want); err != nil || again {
				t.Errorf("a second decision from the result: changed %v, err %v", again, err)
			}
		})
	}
}

func TestPlaceDeploymentRestoresTheManifestExactly(t *testing.T) {
	d := manifestDeployment(ControllerDeploymentName)
	d.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: "manifest", Operator: corev1.TolerationOpExists}}
	original := d.DeepCopy()
	for _, want := range []InfraWant{
		{Infra: cdiv1.ComponentConfig{NodePlacement: cdiv1.NodePlacement{NodeSelector: map[string]string{"a": "b"}}}},
		{Infra: cdiv1.ComponentConfig{NodePlacement: cdiv1.NodePlacement{Tolerations: []corev1.Toleration{{Key: "other", Operator: corev1.TolerationOpExists}}}}, PriorityClassName: "p"},
		{ImagePullPolicy: corev1.PullNever},
		{},
	} {
		next, _, err := PlaceDeployment(d, want)
		if err != nil {
			t.Fatal(err)
		}
		d = next
	}
	if !equality.Semantic.DeepEqual(d, original) {
		t.Errorf("after changes and their removal\n got %+v\nwant %+v", d, original)
	}
}

func TestCDIPriorityClassName(t *testing.T) {
	for _, c := range []struct {
		name string
		spec cdiv1.CDISpec
		want string
	}{
		{"unset: KubeVirt's", cdiv1.CDISpec{}, "kubevirt-cluster-critical"},
		{"empty: KubeVirt's", cdiv1.CDISpec{PriorityClass: ptr.To(cdiv1.CDIPriorityClass(""))}, "kubevirt-cluster-critical"},
		{"named", cdiv1.CDISpec{PriorityClass: ptr.To(cdiv1.CDIPriorityClass("infra-high"))}, "infra-high"},
	} {
		if got := CDIPriorityClassName(&c.spec); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
