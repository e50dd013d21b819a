package clone

import (
	"context"
	"fmt"
	"sort"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/populators"
)

func resourceBytes(n int64) *resource.Quantity { return resource.NewQuantity(n, resource.BinarySI) }

// snapshotPhase (CDI's Snapshot) takes tmp-snapshot-<uid> of a free source
// claim with the planner's VolumeSnapshotClass. Done once the snapshot has
// a creation time (the point in time is fixed; readiness comes later).
type snapshotPhase struct{ run *run }

func (p *snapshotPhase) Name() string { return string(PhaseSnapshot) }

func (p *snapshotPhase) Reconcile(ctx context.Context, f *populators.Flow) (populators.Result, error) {
	r := p.run
	if !r.has(PhaseSnapshot) || f.Prime != nil {
		return populators.Result{Done: true}, nil
	}
	snap := &snapshotv1.VolumeSnapshot{}
	key := types.NamespacedName{Namespace: f.PrimeKey.Namespace, Name: TmpSnapshotName(f.Target.UID)}
	err := r.k.Client.Get(ctx, key, snap)
	switch {
	case apierrors.IsNotFound(err):
		if res, err := r.sourceFree(ctx); err != nil || res != nil {
			return derefResult(res), err
		}
		class := r.decision.SnapshotClass
		if class == "" {
			return wait("NoVolumeSnapshotClass", "no VolumeSnapshotClass for the snapshot clone: "+r.decision.Hint, 30*time.Second), nil
		}
		snap = &snapshotv1.VolumeSnapshot{
			ObjectMeta: tempMeta(f, key.Name),
			Spec: snapshotv1.VolumeSnapshotSpec{
				Source:                  snapshotv1.VolumeSnapshotSource{PersistentVolumeClaimName: ptr.To(r.source.Name)},
				VolumeSnapshotClassName: ptr.To(class),
			},
		}
		if err := r.k.Client.Create(ctx, snap); err != nil && !apierrors.IsAlreadyExists(err) {
			if res, ok := refusedCreate(err, "VolumeSnapshot", key, f.Target); ok {
				return res, nil
			}
			return populators.Result{}, fmt.Errorf("creating VolumeSnapshot %s: %w", key, err)
		}
		f.Event(corev1.EventTypeNormal, "SnapshotForSmartCloneInProgress", "Snapshot",
			fmt.Sprintf("Creating snapshot for smart-clone is in progress (for pvc %s/%s)", r.source.Namespace, r.source.Name))
		return populators.Result{RetryAfter: 2 * time.Second}, nil
	case err != nil:
		return populators.Result{}, fmt.Errorf("reading VolumeSnapshot %s: %w", key, err)
	}
	if snap.Status == nil || snap.Status.CreationTime == nil {
		if msg := snapshotError(snap); msg != "" {
			return wait("SnapshotFailed", msg, 30*time.Second), nil
		}
		return populators.Result{RetryAfter: 2 * time.Second}, nil
	}
	return populators.Result{Done: true}, nil
}

// Cleanup implements populators.Cleaner: the temporary snapshot goes.
func (p *snapshotPhase) Cleanup(ctx context.Context, f *populators.Flow, _ bool) error {
	if !p.run.k.Snapshots {
		return nil
	}
	snap := &snapshotv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: f.Prime.Namespace, Name: TmpSnapshotName(f.Target.UID)}}
	return client.IgnoreNotFound(p.run.k.Client.Delete(ctx, snap))
}

func snapshotError(snap *snapshotv1.VolumeSnapshot) string {
	if st := snap.Status; st != nil && st.Error != nil && st.Error.Message != nil {
		return fmt.Sprintf("VolumeSnapshot %s/%s failed: %s", snap.Namespace, snap.Name, *st.Error.Message)
	}
	return ""
}

// gatePhase holds the prime back until its data source is ready: the
// snapshot readyToUse (SnapshotClone), the source claim bound and free
// (CSIClone). It learns the snapshot's restore size for the prime.
type gatePhase struct{ run *run }

func (p *gatePhase) Name() string {
	if p.run.has(PhaseCSIClone) {
		return string(PhaseCSIClone)
	}
	return string(PhaseSnapshotClone)
}

func (p *gatePhase) Reconcile(ctx context.Context, f *populators.Flow) (populators.Result, error) {
	r := p.run
	switch {
	case f.Prime != nil:
		return populators.Result{Done: true}, nil
	case r.has(PhaseCSIClone):
		res, err := r.sourceFree(ctx)
		return ptr.Deref(res, populators.Result{Done: true}), err
	case !r.has(PhaseSnapshotClone):
		return populators.Result{Done: true}, nil
	}
	name := TmpSnapshotName(f.Target.UID)
	if r.fromSnapshot() {
		name = r.vcs.Spec.Source.Name
	}
	snap := &snapshotv1.VolumeSnapshot{}
	if err := r.k.Client.Get(ctx, types.NamespacedName{Namespace: f.PrimeKey.Namespace, Name: name}, snap); err != nil {
		return populators.Result{}, fmt.Errorf("reading VolumeSnapshot %s/%s: %w", f.PrimeKey.Namespace, name, err)
	}
	if snap.Status == nil || !ptr.Deref(snap.Status.ReadyToUse, false) {
		msg := fmt.Sprintf("waiting for snapshot %s/%s to be ready", snap.Namespace, name)
		if e := snapshotError(snap); e != "" {
			msg = e
		}
		return wait("SnapshotNotReady", msg, 5*time.Second), nil
	}
	if rs := snap.Status.RestoreSize; rs != nil {
		r.restoreSize = rs.Value()
	}
	if r.fromSnapshot() && r.decision.Strategy == cdiv1.CloneStrategyHostAssisted {
		return r.ensureSourceRestore(ctx, f)
	}
	return populators.Result{Done: true}, nil
}

// ensureSourceRestore makes tmp-source-pvc-<uid>, the restore of a source
// snapshot that a host-assisted copy reads, as CDI does: RWO, in the first
// StorageClass (by name) of the snapshot's driver, at its restore size (the
// target's when that is 0), in the snapshot's volume mode (the target's
// when it does not say).
func (r *run) ensureSourceRestore(ctx context.Context, f *populators.Flow) (populators.Result, error) {
	key := types.NamespacedName{Namespace: f.PrimeKey.Namespace, Name: TmpSourceClaimName(f.Target.UID)}
	if err := r.k.Client.Get(ctx, key, &corev1.PersistentVolumeClaim{}); err == nil {
		return populators.Result{Done: true}, nil
	} else if !apierrors.IsNotFound(err) {
		return populators.Result{}, fmt.Errorf("reading %s: %w", key, err)
	}
	driver := ""
	if r.snapSource != nil {
		driver = r.snapSource.ContentDriver
	}
	classes := &storagev1.StorageClassList{}
	if err := r.k.Client.List(ctx, classes); err != nil {
		return populators.Result{}, fmt.Errorf("listing StorageClasses: %w", err)
	}
	sort.Slice(classes.Items, func(i, j int) bool { return classes.Items[i].Name < classes.Items[j].Name })
	class := ""
	for _, sc := range classes.Items {
		if sc.Provisioner == driver {
			class = sc.Name
			break
		}
	}
	if class == "" {
		return wait("NoStorageClassForSnapshot", fmt.Sprintf("no StorageClass provisions with driver %q, which took snapshot %s; create one so that the snapshot can be restored for the copy",
			driver, r.vcs.Spec.Source.Name), 30*time.Second), nil
	}
	size := r.decision.TargetSize
	if r.restoreSize > 0 {
		size = *resourceBytes(r.restoreSize)
	}
	mode := volumeMode(f.Target.Spec.VolumeMode)
	if r.snapSource != nil && r.snapSource.SourceVolumeMode != nil {
		mode = *r.snapSource.SourceVolumeMode
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: tempMeta(f, key.Name),
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(class),
			VolumeMode:       ptr.To(mode),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			DataSource:       &corev1.TypedLocalObjectReference{APIGroup: ptr.To(snapshotv1.GroupName), Kind: "VolumeSnapshot", Name: r.vcs.Spec.Source.Name},
		},
	}
	if node := f.Target.Annotations[cdiv1.AnnSelectedNode]; node != "" {
		pvc.Annotations[cdiv1.AnnSelectedNode] = node
	}
	if err := r.k.Client.Create(ctx, pvc); err != nil && !apierrors.IsAlreadyExists(err) {
		if res, ok := refusedCreate(err, "PersistentVolumeClaim", key, f.Target); ok {
			return res, nil
		}
		return populators.Result{}, fmt.Errorf("creating %s: %w", key, err)
	}
	f.Event(corev1.EventTypeNormal, "CloneFromSnapshotSourceInProgress", "SnapshotClone",
		fmt.Sprintf("Creating PVC from snapshot source is in progress (for snapshot %s/%s)", key.Namespace, r.vcs.Spec.Source.Name))
	return populators.Result{RetryAfter: 2 * time.Second}, nil
}

// prepClaimPhase (CDI's PrepClaim) makes the restored or cloned prime
// bound at the target's full size: a smaller request is raised (the class
// expands it online), done once the capacity is at least the target's size.
type prepClaimPhase struct{ run *run }

func (p *prepClaimPhase) Name() string { return string(PhasePrepClaim) }

func (p *prepClaimPhase) Reconcile(ctx context.Context, f *populators.Flow) (populators.Result, error) {
	r := p.run
	if !r.has(PhasePrepClaim) || f.HandedOver() {
		return populators.Result{Done: true}, nil
	}
	if r.fromSnapshot() && r.decision.Strategy == cdiv1.CloneStrategyHostAssisted {
		// The copy reads a restore of the snapshot: it must be bound.
		restore := &corev1.PersistentVolumeClaim{}
		key := types.NamespacedName{Namespace: f.PrimeKey.Namespace, Name: TmpSourceClaimName(f.Target.UID)}
		if err := r.k.Client.Get(ctx, key, restore); err != nil {
			return populators.Result{}, fmt.Errorf("reading %s: %w", key, err)
		}
		r.source = restore
		if restore.Status.Phase != corev1.ClaimBound {
			return populators.Result{Reason: "Pending", Message: fmt.Sprintf("waiting for the restore %s of the snapshot to be bound", key), RetryAfter: 2 * time.Second}, nil
		}
		return populators.Result{Done: true}, nil
	}
	prime := f.Prime
	if prime.Status.Phase != corev1.ClaimBound {
		return populators.Result{RetryAfter: 2 * time.Second}, nil
	}
	want := r.decision.TargetSize
	req := prime.Spec.Resources.Requests[corev1.ResourceStorage]
	if req.Cmp(want) < 0 {
		patch := client.MergeFrom(prime.DeepCopy())
		prime.Spec.Resources.Requests[corev1.ResourceStorage] = want
		if err := r.k.Client.Patch(ctx, prime, patch); err != nil {
			if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
				return wait("ErrExpandingClaim", fmt.Sprintf("cannot expand the temporary claim %s/%s to %s: %v", prime.Namespace, prime.Name, want.String(), err), 30*time.Second), nil
			}
			return populators.Result{}, fmt.Errorf("expanding %s/%s: %w", prime.Namespace, prime.Name, err)
		}
		f.Event(corev1.EventTypeNormal, "PrepClaimInProgress", "PrepClaim", fmt.Sprintf("expanding the temporary claim %s/%s to %s", prime.Namespace, prime.Name, want.String()))
		return populators.Result{RetryAfter: 2 * time.Second}, nil
	}
	if capacity := prime.Status.Capacity[corev1.ResourceStorage]; capacity.Cmp(want) < 0 {
		return populators.Result{RetryAfter: 2 * time.Second}, nil
	}
	return populators.Result{Done: true}, nil
}

// tempMeta is the metadata of a temporary object of the clone: in the
// prime's namespace, labelled with the target's UID, naming the target.
func tempMeta(f *populators.Flow, name string) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Name: name, Namespace: f.PrimeKey.Namespace,
		Labels: map[string]string{cdiv1.LabelApp: cdiv1.LabelAppValue, cdiv1.LabelOwnedByUID: string(f.Target.UID),
			cdiv1.LabelAppManagedBy: "kubefill", labelExcludeFromBackup: "true"},
		Annotations: map[string]string{populators.TargetAnnotation: populators.TargetRef(f.Target.Namespace, f.Target.Name, f.PrimeKey.Namespace)}}
	return m
}

// refusedCreate turns a create refused by a quota or a policy into a wait
// the user sees: a ResourceQuota's refusal says which quota, in which
// namespace, and what the temporary object is for (CDI's ErrExceededQuota);
// another refusal is the API's, named for what was refused.
func refusedCreate(err error, what string, key types.NamespacedName, target *corev1.PersistentVolumeClaim) (populators.Result, bool) {
	if q, ok := populators.ParseQuotaExceeded(err); ok {
		return wait(populators.ReasonExceededQuota, explainTempQuota(q, what, key, target), populators.QuotaRetry), true
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		return populators.Result{}, false
	}
	return wait(populators.ReasonExceededQuota, fmt.Sprintf("cannot create the clone's temporary %s %s: %v", what, key, err), 30*time.Second), true
}

// explainTempQuota says which quota refused a clone's temporary object and
// what to do, in the style of QuotaExceeded.Explain for the prime. It is pure.
func explainTempQuota(q *populators.QuotaExceeded, what string, key types.NamespacedName, target *corev1.PersistentVolumeClaim) string {
	purpose := "that the clone of " + target.Name + " makes"
	switch {
	case what == "VolumeSnapshot":
		purpose = "that the clone of " + target.Name + " takes of its source"
	case what == "PersistentVolumeClaim":
		purpose = "that restores the source snapshot for the copy to " + target.Name
	}
	msg := q.Refused(key.Namespace, fmt.Sprintf("temporary %s %s %s", what, key.Name, purpose))
	if key.Namespace == target.Namespace {
		msg += "; it lives until the clone is done and counts against the quota with the claim"
	} else {
		msg += "; it lives next to the clone's source and counts against that namespace's quota"
	}
	return msg + ". Nothing was created beyond what was asked; this goes on by itself once the quota has room (raise it or free storage)"
}
