package integration

import (
	"context"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/tests/kit"
)

// volumePopulatorCRD is the shape of the volume-data-source-validator's
// VolumePopulator CRD that matters here: cluster-scoped, with sourceKind.
func volumePopulatorCRD() *apiextensionsv1.CustomResourceDefinition {
	str := apiextensionsv1.JSONSchemaProps{Type: "string"}
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "volumepopulators.populator.storage.k8s.io", Annotations: map[string]string{"api-approved.kubernetes.io": "https://github.com/kubernetes/enhancements/pull/2934"}},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "populator.storage.k8s.io",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "volumepopulators", Singular: "volumepopulator", Kind: "VolumePopulator", ListKind: "VolumePopulatorList"},
			Scope: apiextensionsv1.ClusterScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1beta1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"sourceKind": {Type: "object", Required: []string{"kind"}, Properties: map[string]apiextensionsv1.JSONSchemaProps{"group": str, "kind": str}},
					},
				}},
			}},
		},
	}
}

// TestVolumePopulatorsRegistered: where the VolumePopulator CRD exists, the
// controller declares the populator kinds it runs: import, upload and clone.
func TestVolumePopulatorsRegistered(t *testing.T) {
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: []*apiextensionsv1.CustomResourceDefinition{volumePopulatorCRD()}}); err != nil {
		t.Fatalf("installing the VolumePopulator CRD: %v", err)
	}
	runManager(t, controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0"})
	gvr := schema.GroupVersionResource{Group: "populator.storage.k8s.io", Version: "v1beta1", Resource: "volumepopulators"}
	dyn := dynamic.NewForConfigOrDie(cfg)
	for _, kind := range []string{cdiv1.VolumeImportSourceRef, cdiv1.VolumeUploadSourceRef, cdiv1.VolumeCloneSourceRef} {
		var obj *unstructured.Unstructured
		kit.Until(t, 20*time.Second, "VolumePopulator for "+kind, func() bool {
			var err error
			obj, err = dyn.Resource(gvr).Get(context.Background(), populators.VolumePopulatorName(kind), metav1.GetOptions{})
			return err == nil
		})
		group, _, _ := unstructured.NestedString(obj.Object, "sourceKind", "group")
		got, _, _ := unstructured.NestedString(obj.Object, "sourceKind", "kind")
		if group != cdiv1.GroupName || got != kind {
			t.Errorf("VolumePopulator %s names %s/%s", obj.GetName(), group, got)
		}
	}
}
