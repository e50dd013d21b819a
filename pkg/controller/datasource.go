package controller

import (
	"context"
	"fmt"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// What a DataSource's spec.source names, for mapping events of those
// objects back to it (CDI indexes the same fields: spec.source.pvc,
// spec.source.snapshot, spec.source.dataSource).
const (
	namesPVC        = "pvc"
	namesSnapshot   = "snapshot"
	namesDataSource = "dataSource"
)

// DataSourceNames reports whether ds's spec.source names key as its pvc,
// snapshot or dataSource (what); an empty namespace is the DataSource's. Pure.
func DataSourceNames(ds *cdiv1.DataSource, what string, key types.NamespacedName) bool {
	var ns, name string
	switch src := ds.Spec.Source; {
	case what == namesPVC && src.PVC != nil:
		ns, name = src.PVC.Namespace, src.PVC.Name
	case what == namesSnapshot && src.Snapshot != nil:
		ns, name = src.Snapshot.Namespace, src.Snapshot.Name
	case what == namesDataSource && src.DataSource != nil:
		ns, name = src.DataSource.Namespace, src.DataSource.Name
	default:
		return false
	}
	return name == key.Name && orNamespace(ns, ds.Namespace) == key.Namespace
}

// DataSourceReconciler keeps each DataSource's Ready condition and
// status.source, and copies the *.kubevirt.io labels of its source onto it.
type DataSourceReconciler struct {
	Client client.Client

	// snapshots is set at setup when the VolumeSnapshot API is served.
	snapshots bool
}

// SetupWithManager registers the reconciler: it follows DataSources (and
// the DataSources that reference them), DataVolumes and claims, and
// VolumeSnapshots when their API is served at setup time.
func (r *DataSourceReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	served, err := snapshotKindServed(mgr, volumeSnapshotGVK)
	if err != nil {
		return err
	}
	r.snapshots = served
	c := mgr.GetClient()
	naming := func(what string) handler.EventHandler {
		return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []ctrl.Request {
			return dataSourcesNaming(ctx, c, client.ObjectKeyFromObject(obj), what)
		})
	}
	self := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []ctrl.Request {
		key := client.ObjectKeyFromObject(obj)
		return append([]ctrl.Request{{NamespacedName: key}}, dataSourcesNaming(ctx, c, key, namesDataSource)...)
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named("datasource").
		Watches(&cdiv1.DataSource{}, self, builder.WithPredicates(dataSourceChanged)).
		Watches(&cdiv1.DataVolume{}, naming(namesPVC), builder.WithPredicates(phaseOrLabelsChanged)).
		Watches(&corev1.PersistentVolumeClaim{}, naming(namesPVC), builder.WithPredicates(phaseOrLabelsChanged))
	if served {
		b = b.Watches(&snapshotv1.VolumeSnapshot{}, naming(namesSnapshot), builder.WithPredicates(phaseOrLabelsChanged))
	}
	if err := b.Complete(r); err != nil {
		return fmt.Errorf("building the DataSource controller: %w", err)
	}
	return nil
}

// dataSourcesNaming are the DataSources whose spec.source names key as
// what. It scans the cached DataSources rather than a field index: a
// manager whose cache cannot list DataSources (no RBAC) must still stop when
// cancelled, which an index's informer made at setup prevents.
func dataSourcesNaming(ctx context.Context, c client.Reader, key types.NamespacedName, what ...string) []ctrl.Request {
	list := &cdiv1.DataSourceList{}
	if err := c.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "listing the DataSources to find those naming an object", "object", key)
		return nil
	}
	var reqs []ctrl.Request
	for i := range list.Items {
		for _, w := range what {
			if DataSourceNames(&list.Items[i], w, key) {
				reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
				break
			}
		}
	}
	return reqs
}

// dataSourceChanged passes a DataSource's creation and deletion, and
// updates of its spec.source or its conditions (what a DataSource that
// references it reads).
var dataSourceChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*cdiv1.DataSource)
		n, ok2 := e.ObjectNew.(*cdiv1.DataSource)
		if !ok1 || !ok2 {
			return true
		}
		return !sameDataSourceSource(o.Spec.Source, n.Spec.Source) || !sameConditionStates(o.Status.Conditions, n.Status.Conditions)
	},
}

func sameConditionStates(a, b []cdiv1.DataSourceCondition) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Type != b[i].Type || a[i].Status != b[i].Status || a[i].Reason != b[i].Reason || a[i].Message != b[i].Message {
			return false
		}
	}
	return true
}

// phaseOrLabelsChanged passes creations, deletions, and updates of a
// DataVolume's or claim's phase, a snapshot's status, or their labels.
var phaseOrLabelsChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		if !equality.Semantic.DeepEqual(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) {
			return true
		}
		switch o := e.ObjectOld.(type) {
		case *cdiv1.DataVolume:
			n, ok := e.ObjectNew.(*cdiv1.DataVolume)
			return !ok || o.Status.Phase != n.Status.Phase
		case *corev1.PersistentVolumeClaim:
			n, ok := e.ObjectNew.(*corev1.PersistentVolumeClaim)
			return !ok || o.Status.Phase != n.Status.Phase
		case *snapshotv1.VolumeSnapshot:
			n, ok := e.ObjectNew.(*snapshotv1.VolumeSnapshot)
			return !ok || !equality.Semantic.DeepEqual(o.Status, n.Status)
		}
		return true
	},
}

// Reconcile reads a DataSource's source, decides Ready, and writes the
// copied labels and the status.
func (r *DataSourceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ds := &cdiv1.DataSource{}
	if err := r.Client.Get(ctx, req.NamespacedName, ds); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if ds.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	obs, err := r.observe(ctx, ds)
	if err != nil {
		return ctrl.Result{}, err
	}
	ready := ComputeDataSourceReady(ds, obs)
	logger := log.FromContext(ctx)
	if ready.Status == corev1.ConditionTrue {
		// The patch's base is taken first: WithDataSourceLabels writes into
		// a non-nil map in place.
		patch := client.MergeFrom(ds.DeepCopy())
		if labels, changed := WithDataSourceLabels(ds.Labels, ready.Labels); changed {
			ds.Labels = labels
			if err := r.Client.Patch(ctx, ds, patch); err != nil {
				return ctrl.Result{}, fmt.Errorf("copying the source's labels onto DataSource %s: %w", req.NamespacedName, err)
			}
		}
	}
	status, changed := WithDataSourceReady(ds.Status, ready, metav1.Now())
	if !changed {
		return ctrl.Result{}, nil
	}
	ds.Status = status
	if err := r.Client.Status().Update(ctx, ds); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		}
		return ctrl.Result{}, fmt.Errorf("updating the status of DataSource %s: %w", req.NamespacedName, err)
	}
	logger.V(1).Info("DataSource Ready", "status", ready.Status, "reason", ready.Reason, "message", ready.Message)
	return ctrl.Result{}, nil
}

// observe reads what ComputeDataSourceReady needs.
func (r *DataSourceReconciler) observe(ctx context.Context, ds *cdiv1.DataSource) (DataSourceObservation, error) {
	var obs DataSourceObservation
	if key, ok := DataSourceReference(ds); ok {
		ref := &cdiv1.DataSource{}
		found, err := r.get(ctx, key, ref)
		if err != nil {
			return obs, err
		}
		if found {
			obs.Referenced = ref
		}
	}
	src := EffectiveDataSourceSource(ds, obs.Referenced)
	switch {
	case src == nil:
	case src.PVC != nil:
		key := types.NamespacedName{Namespace: orNamespace(src.PVC.Namespace, ds.Namespace), Name: src.PVC.Name}
		dv, pvc := &cdiv1.DataVolume{}, &corev1.PersistentVolumeClaim{}
		found, err := r.get(ctx, key, dv)
		if err != nil {
			return obs, err
		}
		if found {
			obs.DataVolume = dv
		}
		if found, err = r.get(ctx, key, pvc); err != nil {
			return obs, err
		}
		if found {
			obs.Claim = pvc
		}
	case src.Snapshot != nil && r.snapshots:
		key := types.NamespacedName{Namespace: orNamespace(src.Snapshot.Namespace, ds.Namespace), Name: src.Snapshot.Name}
		snap := &snapshotv1.VolumeSnapshot{}
		found, err := r.get(ctx, key, snap)
		if err != nil {
			return obs, err
		}
		if found {
			obs.Snapshot = snap
		}
	}
	return obs, nil
}

// get reads key into obj; found is false when it does not exist.
func (r *DataSourceReconciler) get(ctx context.Context, key types.NamespacedName, obj client.Object) (found bool, err error) {
	if err := r.Client.Get(ctx, key, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("reading %T %s: %w", obj, key, err)
	}
	return true, nil
}
