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

// Uninstall deletes every object of manifests/ but the CRDs, what
// kube-apiserver calls before the Services behind it, and the namespace
// last.
func TestUninstallOrder(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	objs, err := ManifestObjects(filepath.Join(filepath.Dir(file), "..", "..", "manifests"), "")
	if err != nil {
		t.Fatal(err)
	}
	order := uninstallOrder(objs)
	crds := 0
	for _, u := range objs {
		if u.GetKind() == "CustomResourceDefinition" {
			crds++
		} else if !slices.Contains(order, u) {
			t.Errorf("%s %s/%s is not deleted", u.GetKind(), u.GetNamespace(), u.GetName())
		}
	}
	if crds == 0 || len(order) != len(objs)-crds {
		t.Errorf("%d objects to delete of %d with %d CRDs", len(order), len(objs), crds)
	}
	firstService, lastCalled := len(order), -1
	for i, u := range order {
		switch u.GetKind() {
		case "CustomResourceDefinition":
			t.Errorf("CRD %s is deleted", u.GetName())
		case "APIService", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration":
			lastCalled = i
		case "Service", "Deployment":
			firstService = min(firstService, i)
		case "Namespace":
			if i != len(order)-1 {
				t.Errorf("namespace %s is deleted at %d of %d, not last", u.GetName(), i, len(order))
			}
		}
	}
	if lastCalled < 0 || lastCalled > firstService {
		t.Errorf("the APIService and webhooks (last at %d) are not deleted before the Services and Deployments (first at %d)", lastCalled, firstService)
	}
}
