package cluster

import (
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The install on this cluster requires kube-apiserver's webhook client
// certificate: the apiserver Deployment of manifests/install gets
// --webhook-client-names, and nothing else changes.
func TestInstallRequiresWebhookClientCert(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	objs, err := ManifestObjects(filepath.Join(filepath.Dir(file), "..", "..", "manifests"), "")
	if err != nil {
		t.Fatal(err)
	}
	want := "--webhook-client-names=" + WebhookClientName
	seen := false
	for _, u := range objs {
		before := u.DeepCopy()
		if err := addContainerArgs(u, APIServerDeployment, "apiserver", []string{want}); err != nil {
			t.Fatal(err)
		}
		if u.GetKind() != "Deployment" || u.GetName() != APIServerDeployment {
			if !equalObjects(before, u) {
				t.Errorf("%s %s changed", u.GetKind(), u.GetName())
			}
			continue
		}
		seen = true
		containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
		if !slices.Contains(args, want) || !slices.Contains(args, "--secure-port=8443") {
			t.Errorf("apiserver args %v", args)
		}
	}
	if !seen {
		t.Fatalf("no Deployment %s in the manifests", APIServerDeployment)
	}
	u := &unstructured.Unstructured{Object: map[string]any{"kind": "Deployment", "metadata": map[string]any{"name": APIServerDeployment, "namespace": KubefillNamespace},
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "other"}}}}}}}
	if err := addContainerArgs(u, APIServerDeployment, "apiserver", []string{want}); err == nil {
		t.Error("a Deployment without the container was changed silently")
	}
}

func equalObjects(a, b *unstructured.Unstructured) bool {
	ja, _ := a.MarshalJSON()
	jb, _ := b.MarshalJSON()
	return string(ja) == string(jb)
}
