package populators

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// volumePopulatorGVK is the kind the volume-data-source-validator reads to
// learn which dataSourceRef kinds have a populator.
var volumePopulatorGVK = schema.GroupVersionKind{Group: "populator.storage.k8s.io", Version: "v1beta1", Kind: "VolumePopulator"}

// VolumePopulatorName is the name of the VolumePopulator object for a kind.
func VolumePopulatorName(kind string) string {
	return "kubefill-" + strings.ToLower(kind)
}

// RegisterVolumePopulators declares Kubefill's populator kinds through
// VolumePopulator objects, so that the data-source validator does not warn
// about claims naming them. Clusters without that CRD are left alone.
func RegisterVolumePopulators(ctx context.Context, c client.Client, kinds []string) error {
	if _, err := c.RESTMapper().RESTMapping(volumePopulatorGVK.GroupKind(), volumePopulatorGVK.Version); err != nil {
		if meta.IsNoMatchError(err) {
			log.FromContext(ctx).Info("no VolumePopulator CRD in this cluster; populators not registered")
			return nil
		}
		return fmt.Errorf("looking up the VolumePopulator kind: %w", err)
	}
	for _, kind := range kinds {
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(volumePopulatorGVK)
		obj.SetName(VolumePopulatorName(kind))
		obj.SetLabels(map[string]string{cdiv1.LabelAppManagedBy: "kubefill"})
		if err := unstructured.SetNestedStringMap(obj.Object, map[string]string{"group": cdiv1.GroupName, "kind": kind}, "sourceKind"); err != nil {
			return err
		}
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating VolumePopulator for %s: %w", kind, err)
		}
	}
	return nil
}
