package controller

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/clone"
)

func userPod() *corev1.Pod {
	now := metav1.Now()
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "vm", Namespace: "ns", UID: "u1", ResourceVersion: "7",
			Labels:            map[string]string{"app": "vm"},
			Annotations:       map[string]string{"big": "annotation"},
			DeletionTimestamp: &now,
			ManagedFields:     []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			OwnerReferences:   []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "rs"}},
		},
		Spec: corev1.PodSpec{
			NodeName: "n1",
			Volumes: []corev1.Volume{
				{Name: "disk", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "golden"}}},
				{Name: "ro", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "other", ReadOnly: true}}},
				{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}},
			},
			InitContainers: []corev1.Container{{Name: "init", Image: "i", VolumeMounts: []corev1.VolumeMount{{Name: "disk", MountPath: "/d", ReadOnly: true}}}},
			Containers: []corev1.Container{{Name: "c", Image: "img", Command: []string{"run"},
				Env:          []corev1.EnvVar{{Name: "A", Value: "b"}},
				VolumeMounts: []corev1.VolumeMount{{Name: "disk", MountPath: "/d"}, {Name: "cfg", MountPath: "/etc/cfg"}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

func TestSlimPodKeepsWhatTheCloneChecksRead(t *testing.T) {
	full := userPod()
	slim := SlimPod(full)
	if slim.Name != "vm" || slim.Namespace != "ns" || slim.UID != "u1" || slim.ResourceVersion != "7" ||
		slim.DeletionTimestamp == nil || slim.Labels["app"] != "vm" || len(slim.OwnerReferences) != 1 || slim.Spec.NodeName != "n1" ||
		slim.Status.Phase != corev1.PodRunning {
		t.Errorf("identity, labels, owners, deletion, node or phase lost: %+v", slim)
	}
	if slim.Annotations != nil || slim.ManagedFields != nil || slim.Status.PodIP != "" || slim.Status.Conditions != nil {
		t.Errorf("kept what no one reads: %+v", slim)
	}
	if len(slim.Spec.Volumes) != 2 || slim.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != "golden" || !slim.Spec.Volumes[1].PersistentVolumeClaim.ReadOnly {
		t.Errorf("claim volumes: %+v", slim.Spec.Volumes)
	}
	c := slim.Spec.Containers[0]
	if c.Name != "c" || c.Image != "" || c.Env != nil || len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != "disk" || c.VolumeMounts[0].ReadOnly {
		t.Errorf("container: %+v", c)
	}
	if ic := slim.Spec.InitContainers[0]; len(ic.VolumeMounts) != 1 || !ic.VolumeMounts[0].ReadOnly {
		t.Errorf("init container: %+v", ic)
	}
	// The decisions that read pods decide the same on the slim copy.
	for _, tc := range []struct {
		name string
		pod  func() *corev1.Pod
	}{
		{"running writer", func() *corev1.Pod { p := userPod(); p.DeletionTimestamp = nil; return p }},
		{"terminating", userPod},
		{"read-only mounts", func() *corev1.Pod {
			p := userPod()
			p.DeletionTimestamp = nil
			p.Spec.Containers[0].VolumeMounts[0].ReadOnly = true
			return p
		}},
		{"succeeded", func() *corev1.Pod {
			p := userPod()
			p.DeletionTimestamp = nil
			p.Status.Phase = corev1.PodSucceeded
			return p
		}},
	} {
		p := tc.pod()
		for _, claim := range []string{"golden", "other"} {
			if got, want := clone.PodUsingClaim([]corev1.Pod{*SlimPod(p)}, claim), clone.PodUsingClaim([]corev1.Pod{*p}, claim); got != want {
				t.Errorf("%s, claim %s: PodUsingClaim on the slim pod = %q, on the full one %q", tc.name, claim, got, want)
			}
		}
		if got, want := len(clone.ClaimsOf(SlimPod(p))), len(clone.ClaimsOf(p)); got != want {
			t.Errorf("%s: ClaimsOf the slim pod has %d claims, the full one %d", tc.name, got, want)
		}
	}
}

func TestPodTransformKeepsWorkersWhole(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		worker bool
	}{
		{"user pod", map[string]string{"app": "vm"}, false},
		{"CDI app label", map[string]string{cdiv1.LabelApp: cdiv1.LabelAppValue}, true},
		{"owned by a claim", map[string]string{cdiv1.LabelOwnedByUID: "uid"}, true},
		{"no labels", nil, false},
	} {
		p := userPod()
		p.Labels = tc.labels
		if got := IsWorkerPod(p); got != tc.worker {
			t.Errorf("%s: IsWorkerPod = %v, want %v", tc.name, got, tc.worker)
		}
		out, err := podTransform(p)
		if err != nil {
			t.Fatal(err)
		}
		got := out.(*corev1.Pod)
		if got.ManagedFields != nil {
			t.Errorf("%s: managedFields kept", tc.name)
		}
		if whole := got.Annotations["big"] == "annotation" && got.Spec.Containers[0].Image == "img" && got.Status.PodIP != ""; whole != tc.worker {
			t.Errorf("%s: kept whole = %v, want %v", tc.name, whole, tc.worker)
		}
	}
	// Anything else (a tombstone) passes through the default transform.
	if out, err := podTransform("x"); err != nil || out != "x" {
		t.Errorf("podTransform(string) = %v, %v", out, err)
	}
}

func TestCacheNamespaces(t *testing.T) {
	for _, tc := range []struct {
		name          string
		install       string
		only, exclude []string
		want          map[string]string // namespace → field selector
		wantErr       string
	}{
		{name: "every namespace", install: "kubefill"},
		{name: "only some, and the install namespace", install: "kubefill", only: []string{"a", "b"},
			want: map[string]string{"a": "", "b": "", "kubefill": ""}},
		{name: "only some, no install namespace", only: []string{"a"}, want: map[string]string{"a": ""}},
		{name: "all but some", install: "kubefill", exclude: []string{"b", "a", "b"},
			want: map[string]string{"": "metadata.namespace!=a,metadata.namespace!=b"}},
		{name: "both", only: []string{"a"}, exclude: []string{"b"}, wantErr: "exclude each other"},
		{name: "an empty name", exclude: []string{""}, wantErr: "empty namespace name"},
		{name: "its own install namespace left out", install: "kubefill", exclude: []string{"kubefill"}, wantErr: "its own install namespace kubefill"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := cacheNamespaces(tc.install, tc.only, tc.exclude)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) || (tc.want == nil) != (got == nil) {
				t.Fatalf("namespaces %v, want %v", got, tc.want)
			}
			for ns, sel := range tc.want {
				cfg, ok := got[ns]
				if !ok {
					t.Fatalf("namespace %q not cached: %v", ns, got)
				}
				have := ""
				if cfg.FieldSelector != nil {
					have = cfg.FieldSelector.String()
				}
				if have != sel {
					t.Errorf("namespace %q field selector %q, want %q", ns, have, sel)
				}
			}
		})
	}
}
