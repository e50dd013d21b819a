package clone

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/populators"
)

// reasonCloneError is the running reason of a clone that cannot go on
// (CDI's Error phase).
const reasonCloneError = "Error"

// run is what the phases of one reconcile share: the Pending phase reads
// the clone's inputs and decides; the others act on that.
type run struct {
	k *Kind
	// decision is nil until planned, and stays nil once the prime's volume
	// is handed over (only the rebind is left).
	decision *Decision
	vcs      *cdiv1.VolumeCloneSource
	// source is the source claim (a PVC source); snapshot the source
	// VolumeSnapshot (a snapshot source).
	source   *corev1.PersistentVolumeClaim
	snapshot *snapshotv1.VolumeSnapshot
	// restoreSize is the size a snapshot restores to (0: the target's).
	restoreSize int64
	// snapSource is what the planner read of a source snapshot's content.
	snapSource *SourceSnapshot
}

// has reports whether the planned clone runs phase p.
func (r *run) has(p PhaseName) bool {
	if r.decision == nil {
		return false
	}
	for _, q := range r.decision.Phases {
		if q == p {
			return true
		}
	}
	return false
}

func (r *run) fromSnapshot() bool { return r.vcs != nil && r.vcs.Spec.Source.Kind == "VolumeSnapshot" }

// wait is a phase waiting on something the user can see: the running
// condition says what, and one Warning event per distinct message.
func wait(reason, message string, after time.Duration) populators.Result {
	return populators.Result{Reason: reason, Message: message, Event: corev1.EventTypeWarning, RetryAfter: after}
}

// planPhase (CDI's Pending) reads the source and everything the planner
// needs, and decides the strategy once: it is pinned on the target.
type planPhase struct{ run *run }

func (p *planPhase) Name() string { return string(PhasePending) }

func (p *planPhase) Reconcile(ctx context.Context, f *populators.Flow) (populators.Result, error) {
	if f.HandedOver() {
		return populators.Result{Done: true}, nil
	}
	r, k := p.run, p.run.k
	r.vcs = f.Source.(*cdiv1.VolumeCloneSource)
	src := r.vcs.Spec.Source
	if populators.AnnotatedSourceNamespace(f.Target) != "" && populators.IsCrossNamespace(f.Target) {
		// The base checked the token before anything there was read; now
		// that the VolumeCloneSource is known, it must name its source.
		if msg, _ := k.checkToken(f.Target, &src); msg != "" {
			return wait("SourceNotAuthorized", msg, 30*time.Second), nil
		}
	}
	in, res, err := p.inputs(ctx, f)
	if err != nil || res != nil {
		return ptr.Deref(res, populators.Result{}), err
	}
	d, err := Plan(in)
	var refusal *Refusal
	switch {
	case errors.As(err, &refusal):
		return p.refuse(ctx, f, refusal)
	case errors.Is(err, ErrSourceNotReady):
		return wait("CloneSourceNotReady", err.Error(), 5*time.Second), nil
	case err != nil:
		return populators.Result{}, fmt.Errorf("planning the clone: %w", err)
	}
	r.decision = &d
	return populators.Result{Done: true}, p.pin(ctx, f, d)
}

// pin records the decision on the target the first time: the strategy, the
// phase, and why a faster strategy was not possible.
func (p *planPhase) pin(ctx context.Context, f *populators.Flow, d Decision) error {
	ann := map[string]string{cdiv1.AnnCloneType: string(d.Strategy)}
	if f.Target.Annotations[cdiv1.AnnClonePhase] == "" {
		ann[cdiv1.AnnClonePhase] = string(PhasePending)
	}
	if !d.Pinned {
		if d.FallbackReason != "" && f.Target.Annotations[cdiv1.AnnCloneFallbackReason] == "" {
			ann[cdiv1.AnnCloneFallbackReason] = d.FallbackMessage
			f.Event(corev1.EventTypeWarning, d.FallbackReason, "PlanClone",
				fmt.Sprintf("%s: cloning by host-assisted copy (%s) instead of %s; %s", d.FallbackMessage, cdiv1.CloneStrategyHostAssisted, d.StrategyFrom, d.Hint))
		}
		if d.SnapshotClassEvent != "" {
			f.Event(corev1.EventTypeNormal, EventVolumeSnapshotClassSelected, "PlanClone", d.SnapshotClassEvent)
		}
	}
	return populators.PatchAnnotations(ctx, p.run.k.Client, f.Target, ann)
}

// refuse ends a clone that cannot work as asked (CDI's Error phase).
func (p *planPhase) refuse(ctx context.Context, f *populators.Flow, refusal *Refusal) (populators.Result, error) {
	if f.Target.Annotations[cdiv1.AnnCloneError] != refusal.Message {
		f.Event(corev1.EventTypeWarning, refusal.Event, "PlanClone", refusal.Message)
		f.Event(corev1.EventTypeWarning, EventCloneValidationFailed, "PlanClone", MessageCloneValidationFailed+": "+refusal.Message)
	}
	if err := populators.PatchAnnotations(ctx, p.run.k.Client, f.Target, map[string]string{cdiv1.AnnCloneError: refusal.Message}); err != nil {
		return populators.Result{}, err
	}
	return populators.Result{Reason: reasonCloneError, Message: refusal.Message, RetryAfter: time.Minute}, nil
}

// inputs reads what the planner needs. A non-nil result is a wait.
func (p *planPhase) inputs(ctx context.Context, f *populators.Flow) (Input, *populators.Result, error) {
	r, c := p.run, p.run.k.Client
	in := Input{Target: f.Target}
	ns, src := r.vcs.Namespace, r.vcs.Spec.Source
	className := ptr.Deref(f.Target.Spec.StorageClassName, "")
	in.TargetClass = &storagev1.StorageClass{}
	if err := c.Get(ctx, types.NamespacedName{Name: className}, in.TargetClass); err != nil {
		return in, nil, fmt.Errorf("reading StorageClass %q: %w", className, err)
	}
	in.TargetProfile = profileStatus(ctx, c, className)
	cdis := &cdiv1.CDIList{}
	if err := c.List(ctx, cdis); err != nil && !apierrors.IsNotFound(err) {
		return in, nil, fmt.Errorf("reading the CDI resource: %w", err)
	}
	if len(cdis.Items) > 0 {
		in.CloneStrategyOverride = cdis.Items[0].Spec.CloneStrategyOverride
	}
	config := &cdiv1.CDIConfig{}
	if err := c.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); client.IgnoreNotFound(err) != nil {
		return in, nil, fmt.Errorf("reading CDIConfig: %w", err)
	}
	in.FilesystemOverhead, _ = strconv.ParseFloat(populators.FilesystemOverhead(config, className), 64)
	if r.k.Snapshots {
		classes := &snapshotv1.VolumeSnapshotClassList{}
		if err := c.List(ctx, classes); err != nil {
			return in, nil, fmt.Errorf("listing VolumeSnapshotClasses: %w", err)
		}
		for _, vsc := range classes.Items {
			in.SnapshotClasses = append(in.SnapshotClasses, SnapshotClassOf(vsc.Name, vsc.Driver, vsc.Annotations))
		}
	}
	missing := func(what string) *populators.Result {
		res := wait("CloneWithoutSource", fmt.Sprintf("The source %s %s/%s doesn't exist; waiting for it to be created", what, ns, src.Name), 10*time.Second)
		return &res
	}
	switch src.Kind {
	case "PersistentVolumeClaim":
		r.source = &corev1.PersistentVolumeClaim{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: src.Name}, r.source); apierrors.IsNotFound(err) {
			return in, missing("pvc"), nil
		} else if err != nil {
			return in, nil, fmt.Errorf("reading source claim %s/%s: %w", ns, src.Name, err)
		}
		sc := &SourceClaim{Claim: r.source}
		if name := ptr.Deref(r.source.Spec.StorageClassName, ""); name != "" {
			class := &storagev1.StorageClass{}
			if err := c.Get(ctx, types.NamespacedName{Name: name}, class); err == nil {
				sc.Class, sc.Profile = class, profileStatus(ctx, c, name)
			}
		}
		if r.source.Spec.VolumeName != "" {
			pv := &corev1.PersistentVolume{}
			if err := c.Get(ctx, types.NamespacedName{Name: r.source.Spec.VolumeName}, pv); err == nil && pv.Spec.CSI != nil {
				sc.PVDriver = pv.Spec.CSI.Driver
			}
		}
		in.SourceClaim = sc
	case "VolumeSnapshot":
		if !r.k.Snapshots {
			res := wait("CloneWithoutSource", "the cluster serves no snapshot.storage.k8s.io VolumeSnapshots (or the controller started before their CRDs); cannot clone VolumeSnapshot "+src.Name, time.Minute)
			return in, &res, nil
		}
		r.snapshot = &snapshotv1.VolumeSnapshot{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: src.Name}, r.snapshot); apierrors.IsNotFound(err) {
			return in, missing("snapshot"), nil
		} else if err != nil {
			return in, nil, fmt.Errorf("reading source snapshot %s/%s: %w", ns, src.Name, err)
		}
		ss, err := p.snapshotSource(ctx, r.snapshot)
		if err != nil || ss == nil {
			res := wait("CloneSourceNotReady", fmt.Sprintf("VolumeSnapshot %s/%s is not bound to its content yet", ns, src.Name), 5*time.Second)
			return in, &res, err
		}
		in.SourceSnapshot, r.snapSource = ss, ss
	default:
		res := wait(reasonCloneError, fmt.Sprintf("VolumeCloneSource %s/%s names a %s; a clone source is a PersistentVolumeClaim or a VolumeSnapshot", ns, r.vcs.Name, src.Kind), time.Minute)
		return in, &res, nil
	}
	return in, nil, nil
}

// snapshotSource reads what the planner needs of a snapshot's content; nil
// while the snapshot has none.
func (p *planPhase) snapshotSource(ctx context.Context, snap *snapshotv1.VolumeSnapshot) (*SourceSnapshot, error) {
	st := snap.Status
	if st == nil || st.BoundVolumeSnapshotContentName == nil {
		return nil, nil
	}
	content := &snapshotv1.VolumeSnapshotContent{}
	if err := p.run.k.Client.Get(ctx, types.NamespacedName{Name: *st.BoundVolumeSnapshotContentName}, content); apierrors.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("reading VolumeSnapshotContent %s: %w", *st.BoundVolumeSnapshotContentName, err)
	}
	ss := &SourceSnapshot{RestoreSize: st.RestoreSize, ContentDriver: content.Spec.Driver, SourceVolumeMode: content.Spec.SourceVolumeMode}
	if ss.SourceVolumeMode == nil {
		if m := snap.Annotations[cdiv1.AnnSnapshotSourceVolumeMode]; m != "" {
			ss.SourceVolumeMode = ptr.To(corev1.PersistentVolumeMode(m))
		}
	}
	if st.RestoreSize != nil {
		p.run.restoreSize = st.RestoreSize.Value()
	}
	return ss, nil
}

func profileStatus(ctx context.Context, c client.Client, className string) *cdiv1.StorageProfileStatus {
	profile := &cdiv1.StorageProfile{}
	if err := c.Get(ctx, types.NamespacedName{Name: className}, profile); err != nil {
		return nil
	}
	return &profile.Status
}

// primePhase makes the clone's prime once the strategy's gates have passed;
// it carries the name of the strategy's first phase.
type primePhase struct {
	run   *run
	prime *populators.PrimePhase
}

func (p *primePhase) Name() string {
	d := p.run.decision
	if d != nil && len(d.Phases) > 0 && d.Phases[0] != PhaseSnapshot {
		return string(d.Phases[0])
	}
	if p.run.has(PhaseSnapshot) {
		return string(PhaseSnapshotClone)
	}
	return string(PhaseRebind)
}

func (p *primePhase) Reconcile(ctx context.Context, f *populators.Flow) (populators.Result, error) {
	if p.run.decision == nil && f.Prime != nil {
		return populators.Result{Done: true}, nil // handed over
	}
	res, err := p.prime.Reconcile(ctx, f)
	if err != nil || !res.Done {
		return res, err
	}
	if provisioning(f.Prime) {
		// CDI's CSIClone and SnapshotClone last until the clone or the
		// restore is bound: the DataVolume shows CSICloneInProgress or
		// CloneFromSnapshotSourceInProgress meanwhile, not PrepClaim. The
		// prime's watch brings the target back once it is bound.
		return populators.Result{RetryAfter: 5 * time.Second}, nil
	}
	return res, nil
}

// provisioning reports whether prime is a CSI clone or a snapshot restore
// the driver has not finished (not bound yet). An empty prime, which a
// copy fills, binds when its upload pod starts: it is not waited for. Pure.
func provisioning(prime *corev1.PersistentVolumeClaim) bool {
	return prime != nil && prime.Spec.DataSource != nil && prime.Status.Phase != corev1.ClaimBound
}

// preparePrime renders the prime for the strategy: an empty claim for the
// copy to fill, a restore of the snapshot, or a CSI clone of the source.
func (r *run) preparePrime(target *corev1.PersistentVolumeClaim, _ client.Object, prime *corev1.PersistentVolumeClaim) error {
	d := r.decision
	if d == nil {
		return fmt.Errorf("the clone was not planned")
	}
	prime.Labels[labelExcludeFromBackup] = "true"
	if prime.Spec.Resources.Requests == nil {
		prime.Spec.Resources.Requests = corev1.ResourceList{}
	}
	prime.Spec.Resources.Requests[corev1.ResourceStorage] = d.TargetSize
	src := r.vcs.Spec.Source
	if pc := r.vcs.Spec.PriorityClassName; pc != nil && !priorityFromOtherNamespace(r.vcs) {
		prime.Annotations[cdiv1.AnnPriorityClassName] = *pc
	}
	switch {
	case d.Strategy == cdiv1.CloneStrategyHostAssisted:
		prime.Annotations[cdiv1.AnnCloneRequest] = r.vcs.Namespace + "/" + src.Name
		prime.Annotations[cdiv1.AnnUploadClientName] = UploadClientName(r.vcs.Namespace, src.Name, prime.Namespace, prime.Name)
		prime.Annotations[cdiv1.AnnContentType] = string(contentType(Input{Target: target}))
		if r.vcs.Spec.Preallocation != nil {
			prime.Annotations[cdiv1.AnnPreallocationRequested] = strconv.FormatBool(*r.vcs.Spec.Preallocation)
		}
	case d.Strategy == cdiv1.CloneStrategyCsiClone:
		prime.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: src.Name}
		if capacity, ok := r.source.Status.Capacity[corev1.ResourceStorage]; ok {
			prime.Spec.Resources.Requests[corev1.ResourceStorage] = capacity
		}
	case d.Strategy == cdiv1.CloneStrategySnapshot:
		name := src.Name
		if !r.fromSnapshot() {
			name = TmpSnapshotName(target.UID)
		}
		prime.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr.To(snapshotv1.GroupName), Kind: "VolumeSnapshot", Name: name}
		if r.restoreSize > 0 {
			prime.Spec.Resources.Requests[corev1.ResourceStorage] = *resourceBytes(r.restoreSize)
		}
	}
	return nil
}

// priorityFromOtherNamespace reports whether vcs's priorityClassName was
// asked for in another namespace: a VolumeCloneSource the DataVolume
// controller wrote in the source's namespace for a DataVolume elsewhere
// carries that DataVolume's priority class, which does not choose the
// priority of pods in the source's namespace (see
// populators.IgnoredAcrossNamespaces). Pure.
func priorityFromOtherNamespace(vcs *cdiv1.VolumeCloneSource) bool {
	dv, ok := DataVolumeOf(vcs)
	return ok && dv.Namespace != vcs.Namespace
}
