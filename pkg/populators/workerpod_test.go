package populators

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestWorkloadPlacement(t *testing.T) {
	onStorageNodes := cdiv1.NodePlacement{NodeSelector: map[string]string{"storage": "true"},
		Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}}
	onZoneB := cdiv1.NodePlacement{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 1, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}}}}}}}}
	at := func(sec int) metav1.Time { return metav1.NewTime(time.Unix(int64(1000+sec), 0)) }
	cdi := func(name string, created metav1.Time, phase cdiv1.CDIPhase, p cdiv1.NodePlacement) cdiv1.CDI {
		return cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: created}, Spec: cdiv1.CDISpec{Workloads: p}, Status: cdiv1.CDIStatus{Phase: phase}}
	}
	deleting := cdi("old", at(0), "Deployed", onZoneB)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Unix(2000, 0)}
	cases := []struct {
		name string
		cdis []cdiv1.CDI
		want cdiv1.NodePlacement
	}{
		{"no CDI resource: no constraint", nil, cdiv1.NodePlacement{}},
		{"the one CDI resource's workload", []cdiv1.CDI{cdi("cdi", at(0), "Deployed", onStorageNodes)}, onStorageNodes},
		{"a CDI resource without workload: no constraint", []cdiv1.CDI{cdi("cdi", at(0), "Deployed", cdiv1.NodePlacement{})}, cdiv1.NodePlacement{}},
		{"one in phase Error does not count", []cdiv1.CDI{cdi("a", at(0), "Error", onZoneB), cdi("b", at(5), "Deployed", onStorageNodes)}, onStorageNodes},
		{"of two active, the oldest", []cdiv1.CDI{cdi("new", at(5), "Deployed", onZoneB), cdi("old", at(0), "Deployed", onStorageNodes)}, onStorageNodes},
		{"one being deleted does not count", []cdiv1.CDI{deleting, cdi("cdi", at(5), "Deployed", onStorageNodes)}, onStorageNodes},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := WorkloadPlacement(c.cdis)
			if !equality.Semantic.DeepEqual(got, c.want) {
				t.Errorf("placement %+v, want %+v", got, c.want)
			}
		})
	}
	// The pod's placement is a copy: nothing written to it reaches the CDI
	// resource read from the cache.
	cdis := []cdiv1.CDI{cdi("cdi", at(0), "Deployed", *onStorageNodes.DeepCopy())}
	WorkloadPlacement(cdis).NodeSelector["storage"] = "changed"
	if cdis[0].Spec.Workloads.NodeSelector["storage"] != "true" {
		t.Error("WorkloadPlacement shares its nodeSelector with the CDI resource")
	}
}

func TestWorkerPullPolicy(t *testing.T) {
	at := func(sec int) metav1.Time { return metav1.NewTime(time.Unix(int64(1000+sec), 0)) }
	cdi := func(name string, created metav1.Time, phase cdiv1.CDIPhase, pull corev1.PullPolicy) cdiv1.CDI {
		return cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: created}, Spec: cdiv1.CDISpec{ImagePullPolicy: pull}, Status: cdiv1.CDIStatus{Phase: phase}}
	}
	cases := []struct {
		name string
		cdis []cdiv1.CDI
		want corev1.PullPolicy
	}{
		{"no CDI resource: the flag's", nil, corev1.PullIfNotPresent},
		{"a CDI resource without one: the flag's", []cdiv1.CDI{cdi("cdi", at(0), "Deployed", "")}, corev1.PullIfNotPresent},
		{"the CDI resource's wins", []cdiv1.CDI{cdi("cdi", at(0), "Deployed", corev1.PullAlways)}, corev1.PullAlways},
		{"one in phase Error does not count", []cdiv1.CDI{cdi("a", at(0), "Error", corev1.PullNever), cdi("b", at(5), "Deployed", "")}, corev1.PullIfNotPresent},
		{"of two active, the oldest", []cdiv1.CDI{cdi("new", at(5), "Deployed", corev1.PullAlways), cdi("old", at(0), "Deployed", corev1.PullNever)}, corev1.PullNever},
	}
	for _, c := range cases {
		if got := WorkerPullPolicy(c.cdis, corev1.PullIfNotPresent); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

func TestWorkerPodAnnotations(t *testing.T) {
	optOut := map[string]string{cdiv1.AnnPodSidecarInjectionIstio: "false", cdiv1.AnnPodSidecarInjectionLinkerd: "disabled"}
	cases := []struct {
		name  string
		claim map[string]string
		want  map[string]string
	}{
		{"nothing asked: out of both meshes", nil, optOut},
		{"networks pass", map[string]string{cdiv1.AnnPodNetwork: "ns/net1", cdiv1.AnnPodMultusDefaultNetwork: "ns/def", "other": "x"},
			map[string]string{cdiv1.AnnPodNetwork: "ns/net1", cdiv1.AnnPodMultusDefaultNetwork: "ns/def",
				cdiv1.AnnPodSidecarInjectionIstio: "false", cdiv1.AnnPodSidecarInjectionLinkerd: "disabled"}},
		{"the user's mesh choice wins", map[string]string{cdiv1.AnnPodSidecarInjectionIstio: "true", cdiv1.AnnPodSidecarInjectionLinkerd: "enabled"},
			map[string]string{cdiv1.AnnPodSidecarInjectionIstio: "true", cdiv1.AnnPodSidecarInjectionLinkerd: "enabled"}},
		{"an empty value leaves the key off", map[string]string{cdiv1.AnnPodSidecarInjectionIstio: "", cdiv1.AnnPodNetwork: ""},
			map[string]string{cdiv1.AnnPodSidecarInjectionLinkerd: "disabled"}},
		{"other annotations stay on the claim", map[string]string{cdiv1.AnnPriorityClassName: "high", cdiv1.AnnEndpoint: "http://x"}, optOut},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := WorkerPodAnnotations(c.claim); !equality.Semantic.DeepEqual(got, c.want) {
				t.Errorf("annotations %v, want %v", got, c.want)
			}
		})
	}
}

func TestNewPrimeCarriesWorkerPodAnnotations(t *testing.T) {
	target := claim(nil, map[string]string{cdiv1.AnnPodNetwork: "net1", cdiv1.AnnPodMultusDefaultNetwork: "def",
		cdiv1.AnnPodSidecarInjectionIstio: "true", cdiv1.AnnPodSidecarInjectionLinkerd: "enabled", "unrelated": "x"})
	prime := NewPrime(target, "test")
	for _, key := range WorkerPodAnnotationKeys {
		if prime.Annotations[key] != target.Annotations[key] {
			t.Errorf("prime %s = %q, want the target's %q", key, prime.Annotations[key], target.Annotations[key])
		}
	}
	if _, ok := prime.Annotations["unrelated"]; ok {
		t.Error("prime carries an annotation meant for no worker pod")
	}
}
