package controller

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/go-logr/logr"
	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	"github.com/prometheus/client_golang/prometheus"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/storage"
)

// The DataImportCron controller's removals and snapshots: garbage
// collection, retentionPolicy None cleanup, and the snapshot format.

// cronCopiedLabel matches the labels CDI copies between an import, its
// snapshot and the DataSource: *.kubevirt.io/* and kubevirt.io/*.
var cronCopiedLabel = regexp.MustCompile(`^([\w.]+\.kubevirt.io|kubevirt.io)/[\w-]+$`)

// snapshotImport snapshots a succeeded import (snapshot format); once the
// snapshot is ready the DataVolume and claim go.
func (r *DataImportCronReconciler) snapshotImport(ctx context.Context, cron *cdiv1.DataImportCron, pvc *corev1.PersistentVolumeClaim, class string, now time.Time) error {
	if sc := pvc.Spec.StorageClassName; sc != nil && *sc != class {
		return nil
	}
	current := &snapshotv1.VolumeSnapshot{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(pvc), current)
	if err == nil {
		if snapshotReady(current) {
			return r.deleteImport(ctx, pvc.Namespace, pvc.Name)
		}
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return err
	}
	snapClass, err := r.snapshotClass(ctx, class)
	if err != nil {
		return err
	}
	if snapClass == "" {
		r.event(cron, corev1.EventTypeWarning, ReasonSnapshotClassMissing,
			"StorageProfile %s asks for snapshot format, but no VolumeSnapshotClass serves its driver; the import stays a PVC until one does", class)
		return nil
	}
	snap := &snapshotv1.VolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{
			Name: pvc.Name, Namespace: pvc.Namespace,
			Labels:      map[string]string{cdiv1.LabelApp: cdiv1.LabelAppValue, cdiv1.LabelComponent: ""},
			Annotations: map[string]string{cdiv1.AnnLastUseTime: now.UTC().Format(time.RFC3339Nano)},
		},
		Spec: snapshotv1.VolumeSnapshotSpec{
			Source:                  snapshotv1.VolumeSnapshotSource{PersistentVolumeClaimName: ptr.To(pvc.Name)},
			VolumeSnapshotClassName: ptr.To(snapClass),
		},
	}
	for k, v := range cronResourceLabels(cron) {
		snap.Labels[k] = v
	}
	for k, v := range pvc.Labels {
		if cronCopiedLabel.MatchString(k) {
			snap.Labels[k] = v
		}
	}
	if m := pvc.Spec.VolumeMode; m != nil {
		snap.Annotations[cdiv1.AnnSnapshotSourceVolumeMode] = string(*m)
	}
	if err := r.Client.Create(ctx, snap); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("snapshotting import %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	return nil
}

// snapshotClass is the StorageProfile's snapshot class, else the one
// serving the class's driver.
func (r *DataImportCronReconciler) snapshotClass(ctx context.Context, class string) (string, error) {
	p := &cdiv1.StorageProfile{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: class}, p); err == nil && ptr.Deref(p.Status.SnapshotClass, "") != "" {
		return *p.Status.SnapshotClass, nil
	} else if client.IgnoreNotFound(err) != nil {
		return "", err
	}
	sc := &storagev1.StorageClass{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: class}, sc); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	list := &snapshotv1.VolumeSnapshotClassList{}
	if err := r.Client.List(ctx, list); err != nil {
		return "", err
	}
	name, _ := storage.SnapshotClassFor(sc.Provisioner, nil, list.Items)
	return name, nil
}

// deleteImport deletes an import's DataVolume, or its claim when the
// DataVolume is gone.
func (r *DataImportCronReconciler) deleteImport(ctx context.Context, ns, name string) error {
	om := metav1.ObjectMeta{Name: name, Namespace: ns}
	err := r.Client.Delete(ctx, &cdiv1.DataVolume{ObjectMeta: om})
	if err == nil || !apierrors.IsNotFound(err) {
		return err
	}
	return client.IgnoreNotFound(r.Client.Delete(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: om}))
}

// collectGarbage removes the imports past importsToKeep by last use:
// claims (through their DataVolumes), old DataVolumes whose claim lost the
// label, and snapshots.
func (r *DataImportCronReconciler) collectGarbage(ctx context.Context, cron *cdiv1.DataImportCron, logger logr.Logger) error {
	keep := ImportsToKeep(cron)
	sel := client.MatchingLabels{cdiv1.LabelDataImportCron: cron.Name}
	// Uncached: the claims' last-use times were just written, and the cache
	// may not have them yet.
	claims := &corev1.PersistentVolumeClaimList{}
	if err := r.Reader.List(ctx, claims, client.InNamespace(cron.Namespace), sel); err != nil {
		return err
	}
	// The import the DataSource points at is never collected; claims being
	// deleted already are not counted.
	protected := map[string]bool{}
	if last := cron.Status.LastImportedPVC; last != nil {
		protected[last.Name] = true
	}
	var ptrs []*corev1.PersistentVolumeClaim
	for i := range claims.Items {
		if claims.Items[i].DeletionTimestamp == nil {
			ptrs = append(ptrs, &claims.Items[i])
		}
	}
	for _, c := range Outdated(ptrs, keep) {
		if protected[c.Name] {
			continue
		}
		logger.Info("garbage collecting an outdated import", "claim", c.Name, "importsToKeep", keep)
		if err := r.deleteImport(ctx, c.Namespace, c.Name); err != nil {
			return err
		}
	}
	dvs := &cdiv1.DataVolumeList{}
	if err := r.Client.List(ctx, dvs, client.InNamespace(cron.Namespace), sel); err != nil {
		return err
	}
	if len(dvs.Items) > keep {
		for i := range dvs.Items {
			dv := &dvs.Items[i]
			c := &corev1.PersistentVolumeClaim{}
			if err := r.Client.Get(ctx, client.ObjectKeyFromObject(dv), c); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return err
			}
			if c.Labels[cdiv1.LabelDataImportCron] != cron.Name {
				logger.Info("garbage collecting an old import whose claim has no cron label", "dataVolume", dv.Name)
				if err := r.deleteImport(ctx, dv.Namespace, dv.Name); err != nil {
					return err
				}
			}
		}
	}
	if !r.snapshots {
		return nil
	}
	snaps := &snapshotv1.VolumeSnapshotList{}
	if err := r.Reader.List(ctx, snaps, client.InNamespace(cron.Namespace), sel); err != nil {
		if meta.IsNoMatchError(err) {
			return nil
		}
		return err
	}
	var sp []*snapshotv1.VolumeSnapshot
	for i := range snaps.Items {
		if snaps.Items[i].DeletionTimestamp == nil {
			sp = append(sp, &snaps.Items[i])
		}
	}
	for _, s := range Outdated(sp, keep) {
		if protected[s.Name] {
			continue
		}
		logger.Info("garbage collecting an outdated snapshot", "snapshot", s.Name, "importsToKeep", keep)
		if err := r.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// cleanup runs when a cron is gone: its poller objects and gauge always go;
// with retentionPolicy None, everything carrying both cron labels.
func (r *DataImportCronReconciler) cleanup(ctx context.Context, key types.NamespacedName, logger logr.Logger) error {
	outdatedGauge.DeletePartialMatch(prometheus.Labels{"ns": key.Namespace, "cron_name": key.Name})
	if r.Namespace != "" {
		sel := client.MatchingLabels{cdiv1.LabelDataImportCron: key.Name, cdiv1.LabelDataImportCronNs: key.Namespace}
		bg := client.PropagationPolicy(metav1.DeletePropagationBackground)
		cjs := &batchv1.CronJobList{}
		if err := r.Reader.List(ctx, cjs, client.InNamespace(r.Namespace), sel); err != nil {
			return err
		}
		for i := range cjs.Items {
			// The copies first: the CronJob says which they are.
			if err := r.deletePollerCopiesOf(ctx, &cjs.Items[i], key.Namespace, key.Name); err != nil {
				return err
			}
			if err := r.Client.Delete(ctx, &cjs.Items[i], bg); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
		jobs := &batchv1.JobList{}
		if err := r.Reader.List(ctx, jobs, client.InNamespace(r.Namespace), sel); err != nil {
			return err
		}
		for i := range jobs.Items {
			if err := r.Client.Delete(ctx, &jobs.Items[i], bg); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	sel := client.MatchingLabels{cdiv1.LabelDataImportCron: key.Name, cdiv1.LabelDataImportCronCleanup: "true"}
	lists := []client.ObjectList{&cdiv1.DataSourceList{}, &cdiv1.DataVolumeList{}, &corev1.PersistentVolumeClaimList{}}
	if r.snapshots {
		lists = append(lists, &snapshotv1.VolumeSnapshotList{})
	}
	for _, l := range lists {
		if err := r.Client.List(ctx, l, client.InNamespace(key.Namespace), sel); err != nil {
			if meta.IsNoMatchError(err) {
				continue
			}
			return err
		}
		if err := meta.EachListItem(l, func(o runtime.Object) error {
			obj := o.(client.Object)
			logger.Info("retentionPolicy None: deleting with the cron", "kind", fmt.Sprintf("%T", obj), "name", obj.GetName())
			return client.IgnoreNotFound(r.Client.Delete(ctx, obj))
		}); err != nil {
			return err
		}
	}
	return nil
}
