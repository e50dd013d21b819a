package controller

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

// The poller's pods are placed by the CDI resource's spec.workload and pull
// with CDIConfig's secrets, in the CronJob and in the initial Job alike.
func TestPollerPodPlacementAndPullSecrets(t *testing.T) {
	workload := cdiv1.NodePlacement{
		NodeSelector: map[string]string{"infra": "true"},
		Tolerations:  []corev1.Toleration{{Key: "infra", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpExists}}}}}}},
	}
	pull := []corev1.LocalObjectReference{{Name: "mirror-pull"}}
	cases := []struct {
		name       string
		objs       []client.Object
		wantPlaced cdiv1.NodePlacement
		wantPull   []corev1.LocalObjectReference
	}{
		{"neither CDI resource nor CDIConfig", nil, cdiv1.NodePlacement{}, nil},
		{"both", []client.Object{
			&cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}, Spec: cdiv1.CDISpec{Workloads: *workload.DeepCopy()}},
			&cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: cdiv1.CDIConfigName}, Status: cdiv1.CDIConfigStatus{ImagePullSecrets: pull}},
		}, workload, pull},
		{"a CDIConfig without pull secrets", []client.Object{
			&cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: cdiv1.CDIConfigName}},
		}, cdiv1.NodePlacement{}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &DataImportCronReconciler{Client: fake.NewClientBuilder().WithScheme(NewScheme()).WithObjects(c.objs...).Build(), Image: "img:1"}
			cron := registryCronWithRefs("", "")
			p, err := r.pollerSpec(context.Background(), cron)
			if err != nil {
				t.Fatal(err)
			}
			for what, ps := range map[string]corev1.PodSpec{
				"CronJob":     newPollerCronJob(cron, "kubefill", p).Spec.JobTemplate.Spec.Template.Spec,
				"initial Job": newInitialJob(cron, "kubefill", p).Spec.Template.Spec,
			} {
				got := cdiv1.NodePlacement{NodeSelector: ps.NodeSelector, Affinity: ps.Affinity, Tolerations: ps.Tolerations}
				if !equality.Semantic.DeepEqual(got, c.wantPlaced) {
					t.Errorf("%s placement %+v, want %+v", what, got, c.wantPlaced)
				}
				if !equality.Semantic.DeepEqual(ps.ImagePullSecrets, c.wantPull) {
					t.Errorf("%s imagePullSecrets %v, want %v", what, ps.ImagePullSecrets, c.wantPull)
				}
			}
		})
	}
}

// TestPollerPodOutOfMeshes: the poller's pods opt out of Istio and Linkerd
// as worker pods do, in a new CronJob and Job and in one applied again.
func TestPollerPodOutOfMeshes(t *testing.T) {
	cron := registryCronWithRefs("", "")
	old := newPollerCronJob(cron, "kubefill", pollerSpec{})
	old.Spec.JobTemplate.Spec.Template.Annotations = map[string]string{"kept": "yes"}
	applyCronJob(old, cron, pollerSpec{})
	for what, meta := range map[string]metav1.ObjectMeta{
		"CronJob":         newPollerCronJob(cron, "kubefill", pollerSpec{}).Spec.JobTemplate.Spec.Template.ObjectMeta,
		"initial Job":     newInitialJob(cron, "kubefill", pollerSpec{}).Spec.Template.ObjectMeta,
		"applied CronJob": old.Spec.JobTemplate.Spec.Template.ObjectMeta,
	} {
		if meta.Annotations[cdiv1.AnnPodSidecarInjectionIstio] != "false" || meta.Annotations[cdiv1.AnnPodSidecarInjectionLinkerd] != "disabled" {
			t.Errorf("%s pod annotations %v, want istio %q and linkerd %q", what, meta.Annotations, "false", "disabled")
		}
	}
	if old.Spec.JobTemplate.Spec.Template.Annotations["kept"] != "yes" {
		t.Error("applying the CronJob again dropped an annotation it does not own")
	}
}

// The poller skips TLS checks for a registry CDIConfig lists as insecure,
// and trusts the import proxy's CA, mounted from the install namespace's
// ConfigMap CDIConfig names.
func TestPollerPodInsecureRegistryAndProxyCA(t *testing.T) {
	cases := []struct {
		name         string
		insecure     []string
		trustedCA    string
		wantInsecure bool
	}{
		{"listed with its port, and a proxy CA", []string{"registry.a.svc:5000"}, "proxy-ca", true},
		{"listed without the port the URL gives", []string{"registry.a.svc"}, "", false},
		{"neither", nil, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			config := &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: cdiv1.CDIConfigName}, Spec: cdiv1.CDIConfigSpec{InsecureRegistries: c.insecure}}
			if c.trustedCA != "" {
				config.Status.ImportProxy = &cdiv1.ImportProxy{HTTPSProxy: ptr.To("http://proxy.test:3128"), TrustedCAProxy: ptr.To(c.trustedCA)}
			}
			r := &DataImportCronReconciler{Client: fake.NewClientBuilder().WithScheme(NewScheme()).WithObjects(config).Build(), Image: "img:1"}
			cron := registryCronWithRefs("", "")
			p, err := r.pollerSpec(context.Background(), cron)
			if err != nil {
				t.Fatal(err)
			}
			ps := newPollerCronJob(cron, "kubefill", p).Spec.JobTemplate.Spec.Template.Spec
			ctr := ps.Containers[0]
			env := map[string]string{}
			for _, e := range ctr.Env {
				env[e.Name] = e.Value
			}
			if got := env[contract.EnvInsecureTLS] == "true"; got != c.wantInsecure {
				t.Errorf("INSECURE_TLS set %v, want %v (env %v)", got, c.wantInsecure, ctr.Env)
			}
			i := slices.IndexFunc(ps.Volumes, func(v corev1.Volume) bool { return v.Name == contract.ProxyCertVolume })
			if c.trustedCA == "" {
				if i >= 0 || env[contract.EnvProxyCertDir] != "" {
					t.Errorf("a proxy CA without trustedCAProxy: volumes %v env %v", ps.Volumes, ctr.Env)
				}
				return
			}
			if i < 0 || ps.Volumes[i].ConfigMap == nil || ps.Volumes[i].ConfigMap.Name != c.trustedCA {
				t.Fatalf("volumes %+v, want ConfigMap %s as %s", ps.Volumes, c.trustedCA, contract.ProxyCertVolume)
			}
			if !slices.ContainsFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.Name == contract.ProxyCertVolume && m.MountPath == contract.ProxyCertDir && m.ReadOnly
			}) || env[contract.EnvProxyCertDir] != contract.ProxyCertDir {
				t.Errorf("mounts %+v env %v, want %s read-only at %s named by %s", ctr.VolumeMounts, ctr.Env, contract.ProxyCertVolume, contract.ProxyCertDir, contract.EnvProxyCertDir)
			}
		})
	}
}
