package controller

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// DataVolumeObserver logs every DataVolume change and acts on none. It keeps
// the manager honest (caches, health, metrics, leader election all run for
// real) until the DataVolume reconciler lands; it is replaced then.
type DataVolumeObserver struct {
	Client client.Client
}

// SetupWithManager registers the observer with mgr.
func (o *DataVolumeObserver) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&cdiv1.DataVolume{}).
		Named("datavolume-observer").
		Complete(o)
}

// Reconcile logs what it sees of one DataVolume.
func (o *DataVolumeObserver) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	dv := &cdiv1.DataVolume{}
	if err := o.Client.Get(ctx, req.NamespacedName, dv); err != nil {
		if apierrors.IsNotFound(err) {
			logger.Info("DataVolume deleted")
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading DataVolume %s: %w", req.NamespacedName, err)
	}
	logger.Info("DataVolume observed (not acted on yet)", "source", describeSource(dv), "phase", dv.Status.Phase)
	return ctrl.Result{}, nil
}

// describeSource names a DataVolume's source kind for logs.
func describeSource(dv *cdiv1.DataVolume) string {
	if dv.Spec.SourceRef != nil {
		return "sourceRef:" + dv.Spec.SourceRef.Kind
	}
	s := dv.Spec.Source
	switch {
	case s == nil:
		return "none"
	case s.HTTP != nil:
		return "http"
	case s.S3 != nil:
		return "s3"
	case s.GCS != nil:
		return "gcs"
	case s.Registry != nil:
		return "registry"
	case s.PVC != nil:
		return "pvc"
	case s.Snapshot != nil:
		return "snapshot"
	case s.Upload != nil:
		return "upload"
	case s.Blank != nil:
		return "blank"
	case s.Imageio != nil:
		return "imageio"
	case s.VDDK != nil:
		return "vddk"
	}
	return "unknown"
}
