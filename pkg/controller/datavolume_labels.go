package controller

import (
	"context"
	"fmt"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// defaultInstancetypeLabels are the labels KubeVirt's instancetype
// inference reads from a VM's volume, as CDI's DefaultInstanceTypeLabels.
var defaultInstancetypeLabels = []string{
	cdiv1.LabelDefaultInstancetype, cdiv1.LabelDefaultInstancetypeKind,
	cdiv1.LabelDefaultPreference, cdiv1.LabelDefaultPreferenceKind,
}

// InheritedInstancetypeLabels are the default instancetype and preference
// labels a clone DataVolume takes from what it clones, as CDI copies them:
// none when the DataVolume already carries any of them (the user chose),
// else each the source has. Pure.
func InheritedInstancetypeLabels(dvLabels, source map[string]string) map[string]string {
	if hasInstancetypeLabel(dvLabels) {
		return nil
	}
	out := map[string]string{}
	for _, k := range defaultInstancetypeLabels {
		if v, ok := source[k]; ok {
			out[k] = v
		}
	}
	return out
}

func hasInstancetypeLabel(labels map[string]string) bool {
	for _, k := range defaultInstancetypeLabels {
		if _, ok := labels[k]; ok {
			return true
		}
	}
	return false
}

// inheritInstancetypeLabels puts on a clone DataVolume the default
// instancetype and preference labels of its source: the sourceRef
// DataSource's (which has its claim's), else the source claim's or
// snapshot's. It runs once the clone is authorised for the DataVolume's
// user, so it reads nothing that user may not clone; the labels then reach
// the claim with the DataVolume's own.
func (r *DataVolumeReconciler) inheritInstancetypeLabels(ctx context.Context, dv *cdiv1.DataVolume, src CloneSource) error {
	if hasInstancetypeLabel(dv.Labels) {
		return nil
	}
	var obj client.Object
	key := types.NamespacedName{Namespace: src.Namespace, Name: src.Name}
	switch {
	case dv.Spec.SourceRef != nil:
		obj = &cdiv1.DataSource{}
		key = types.NamespacedName{Namespace: ptr.Deref(dv.Spec.SourceRef.Namespace, ""), Name: dv.Spec.SourceRef.Name}
		if key.Namespace == "" {
			key.Namespace = dv.Namespace
		}
	case src.Snapshot:
		obj = &snapshotv1.VolumeSnapshot{}
	default:
		obj = &corev1.PersistentVolumeClaim{}
	}
	if err := r.reader().Get(ctx, key, obj); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			// Nothing to take labels from: what stops the clone is said elsewhere.
			return nil
		}
		return fmt.Errorf("reading the clone source %s for its instancetype labels: %w", key, err)
	}
	add := InheritedInstancetypeLabels(dv.Labels, obj.GetLabels())
	if len(add) == 0 {
		return nil
	}
	patch := client.MergeFrom(dv.DeepCopy())
	if dv.Labels == nil {
		dv.Labels = map[string]string{}
	}
	for k, v := range add {
		dv.Labels[k] = v
	}
	if err := r.Client.Patch(ctx, dv, patch); err != nil {
		return fmt.Errorf("labelling DataVolume %s with its source's instancetype labels: %w", dv.Name, err)
	}
	return nil
}
