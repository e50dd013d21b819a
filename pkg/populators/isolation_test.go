package populators

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// The decisions that keep one namespace's claim from reaching into another.

func TestIgnoredAcrossNamespaces(t *testing.T) {
	both := map[string]string{cdiv1.AnnPodRetainAfterCompletion: "true", cdiv1.AnnPriorityClassName: "high", cdiv1.AnnSelectedNode: "node-1"}
	cases := []struct {
		name      string
		ann       map[string]string
		namespace string
		want      []string
	}{
		{"same namespace keeps everything", both, "vms", nil},
		{"no namespace given", both, "", nil},
		{"source namespace: retain and priority ignored", both, "golden", []string{cdiv1.AnnPodRetainAfterCompletion, cdiv1.AnnPriorityClassName}},
		{"only retain asked for", map[string]string{cdiv1.AnnPodRetainAfterCompletion: "false"}, "golden", []string{cdiv1.AnnPodRetainAfterCompletion}},
		{"nothing asked for", map[string]string{cdiv1.AnnSelectedNode: "node-1"}, "golden", nil},
		{"source namespace: networks ignored, mesh choices kept",
			map[string]string{cdiv1.AnnPodNetwork: "net1", cdiv1.AnnPodMultusDefaultNetwork: "ns/def", cdiv1.AnnPodSidecarInjectionIstio: "true"}, "golden",
			[]string{cdiv1.AnnPodNetwork, cdiv1.AnnPodMultusDefaultNetwork}},
	}
	for _, c := range cases {
		got := IgnoredAcrossNamespaces(claim(nil, c.ann), c.namespace)
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// The prime in the source's namespace carries neither, but keeps the node.
	prime := newPrimeIn(claim(nil, both), "VolumeCloneSource", "golden")
	if _, ok := prime.Annotations[cdiv1.AnnPodRetainAfterCompletion]; ok {
		t.Errorf("prime in golden keeps %s", cdiv1.AnnPodRetainAfterCompletion)
	}
	if _, ok := prime.Annotations[cdiv1.AnnPriorityClassName]; ok {
		t.Errorf("prime in golden keeps %s", cdiv1.AnnPriorityClassName)
	}
	if prime.Annotations[cdiv1.AnnSelectedNode] != "node-1" || prime.Annotations[annTargetName] != "vms/disk" {
		t.Errorf("prime in golden: annotations %v", prime.Annotations)
	}
	same := newPrimeIn(claim(nil, both), "VolumeImportSource", "vms")
	if same.Annotations[cdiv1.AnnPriorityClassName] != "high" || same.Annotations[cdiv1.AnnPodRetainAfterCompletion] != "true" {
		t.Errorf("prime in the claim's namespace: annotations %v", same.Annotations)
	}
	msg := IgnoredAcrossNamespacesMessage([]string{cdiv1.AnnPodRetainAfterCompletion, cdiv1.AnnPriorityClassName}, "golden")
	for _, want := range []string{cdiv1.AnnPodRetainAfterCompletion, cdiv1.AnnPriorityClassName, "golden"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not name %s", msg, want)
		}
	}
}

func TestRetainWorkers(t *testing.T) {
	retain := map[string]string{cdiv1.AnnPodRetainAfterCompletion: "true"}
	cases := []struct {
		name      string
		ann       map[string]string
		namespace string
		want      bool
	}{
		{"asked, same namespace", retain, "vms", true},
		{"asked, no prime namespace", retain, "", true},
		{"asked, the source's namespace", retain, "golden", false},
		{"not asked", nil, "vms", false},
		{"false", map[string]string{cdiv1.AnnPodRetainAfterCompletion: "false"}, "vms", false},
	}
	for _, c := range cases {
		if got := RetainWorkers(claim(nil, c.ann), c.namespace); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestCleansWhenRefused(t *testing.T) {
	importRef := &corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeImportSourceRef, Name: "src", Namespace: ptr.To("b")}
	cloneRef := &corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeCloneSourceRef, Name: "vcs", Namespace: ptr.To("b")}
	localClone := &corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeCloneSourceRef, Name: "vcs"}
	cases := []struct {
		name string
		pvc  *corev1.PersistentVolumeClaim
		want bool
	}{
		{"import from a granted namespace", claim(importRef, nil), true},
		{"clone through a ReferenceGrant", claim(cloneRef, nil), true},
		{"clone by token (dataSourceNamespace)", claim(localClone, map[string]string{cdiv1.AnnDataSourceNamespace: "b"}), false},
		{"same namespace", claim(&corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeImportSourceRef, Name: "src"}, nil), false},
	}
	for _, c := range cases {
		if got := CleansWhenRefused(c.pvc); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	prime := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Name: "prime-u-1"}}
	msg := RevokedMessage("no ReferenceGrant allows it", prime)
	if !strings.HasPrefix(msg, "no ReferenceGrant allows it; ") || !strings.Contains(msg, "vms/prime-u-1 was deleted") || !strings.Contains(msg, "starts over") {
		t.Errorf("RevokedMessage = %q", msg)
	}
}

func TestUploadServingNames(t *testing.T) {
	for _, c := range []struct {
		prime, service, label string
	}{
		{"prime-u-1", "cdi-upload-prime-u-1", "prime-u-1"},
		// An in-place upload target named like another namespace's Service.
		{"victim.b.svc", cdiv1.UploadServiceName("victim.b.svc"), "victim.b.svc"},
		{strings.Repeat("x", 64), cdiv1.UploadServiceName(strings.Repeat("x", 64)), cdiv1.UploadServiceName(strings.Repeat("x", 64))},
	} {
		p := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: c.prime}}
		if got := UploadServiceName(p); got != c.service {
			t.Errorf("%s: Service %q, want %q", c.prime, got, c.service)
		}
		if got := uploadTargetLabel(p); got != c.label || len(validation.IsValidLabelValue(got)) > 0 {
			t.Errorf("%s: label %q, want %q (a label value)", c.prime, got, c.label)
		}
	}
	hosts := UploadServingHosts(cdiv1.UploadServiceName("victim.b.svc"), "a")
	if len(hosts) != 2 || hosts[0] != cdiv1.UploadServiceHost("a", "victim.b.svc") || hosts[1] != hosts[0]+".cluster.local" {
		t.Errorf("serving hosts %v", hosts)
	}
	for _, h := range hosts {
		if strings.Contains(h, ".b.") {
			t.Errorf("host %s names namespace b", h)
		}
	}
}

func TestImportProxySecret(t *testing.T) {
	cases := []struct {
		name  string
		proxy *cdiv1.ImportProxy
		want  map[string]string
	}{
		{"none", nil, nil},
		{"CDI's empty proxy", &cdiv1.ImportProxy{HTTPProxy: ptr.To(""), HTTPSProxy: ptr.To(""), NoProxy: ptr.To(""), TrustedCAProxy: ptr.To("")}, nil},
		{"all three", &cdiv1.ImportProxy{HTTPProxy: ptr.To("http://u:p@h:1"), HTTPSProxy: ptr.To("http://u:p@h:2"), NoProxy: ptr.To(".local")},
			map[string]string{"http_proxy": "http://u:p@h:1", "https_proxy": "http://u:p@h:2", "no_proxy": ".local"}},
		{"https only", &cdiv1.ImportProxy{HTTPSProxy: ptr.To("http://h:2")}, map[string]string{"https_proxy": "http://h:2"}},
	}
	for _, c := range cases {
		got := importProxySecret(c.proxy)
		if len(got) != len(c.want) || (c.want == nil) != (got == nil) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
			continue
		}
		for k, v := range c.want {
			if string(got[k]) != v {
				t.Errorf("%s: %s=%q, want %q", c.name, k, got[k], v)
			}
		}
	}
}
