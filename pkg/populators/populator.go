package populators

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// WorkerState is where the worker filling a prime stands, as a kind reports it.
type WorkerState struct {
	// Phase is the worker pod's phase; empty while no pod exists yet.
	Phase corev1.PodPhase
	// Ready is the worker's readiness (an upload server accepts data once ready).
	Ready bool
	// Restarts counts how often the worker was started again after failing.
	Restarts int32
	// Progress is CDI's progress string ("45.20%"), empty when unknown.
	Progress string
	// Reason and Message explain the state for users, e.g. the importer's error.
	Reason, Message string
	// Permanent says a failure will not be retried: the user must change something.
	Permanent bool
	// RetryAfter asks to look again after this long (backoff, progress polling).
	RetryAfter time.Duration
}

// Done reports whether the worker finished filling the prime.
func (w WorkerState) Done() bool { return w.Phase == corev1.PodSucceeded }

// Kind is what one populator kind supplies to the shared reconciler.
type Kind interface {
	// Name is the dataSourceRef kind it fills, e.g. "VolumeImportSource".
	Name() string
	// GetSource reads the source object a target's dataSourceRef names.
	GetSource(ctx context.Context, key types.NamespacedName) (client.Object, error)
	// PreparePrime adds what the worker needs to a new prime, before it is created.
	PreparePrime(target *corev1.PersistentVolumeClaim, source client.Object, prime *corev1.PersistentVolumeClaim) error
	// Fill makes sure a worker is filling prime and reports its state; it is
	// called on every reconcile until the state is Done.
	Fill(ctx context.Context, target, prime *corev1.PersistentVolumeClaim, source client.Object) (WorkerState, error)
	// Cleanup removes the workers once the data has moved to the target.
	// Retained workers (CDI's retain annotation) are detached, not deleted.
	Cleanup(ctx context.Context, prime *corev1.PersistentVolumeClaim, retain bool) error
}

// Reconciler is the populator flow shared by every kind: for a PVC whose
// dataSourceRef names its kind it creates a PVC-prime, lets the kind fill
// it, rebinds the filled volume to the PVC and removes the prime.
type Reconciler struct {
	Client   client.Client
	Recorder recorder.EventRecorder
	Kind     Kind
	// Events reads the prime's events (uncached, by field selector) to copy
	// them to the target; nil copies none.
	Events client.Reader
}

// SetupWithManager registers r for PVCs, following their primes and the
// objects the primes own (worker pods) back to the target.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	kind := r.Kind.Name()
	toTarget := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []ctrl.Request {
		return targetOf(obj)
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("populator-"+kind).
		For(&corev1.PersistentVolumeClaim{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
			pvc, ok := obj.(*corev1.PersistentVolumeClaim)
			return ok && Handles(pvc, kind)
		}))).
		Watches(&corev1.PersistentVolumeClaim{}, toTarget).
		Watches(&corev1.Pod{}, toTarget).
		Complete(r)
}

// targetOf maps a prime, or a worker labelled with its target's UID, to the
// target's request. Primes name their target in their owner reference.
func targetOf(obj client.Object) []ctrl.Request {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.Kind == "PersistentVolumeClaim" && ref.Controller != nil && *ref.Controller {
			if _, isPVC := obj.(*corev1.PersistentVolumeClaim); isPVC {
				return []ctrl.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}}}
			}
		}
	}
	if name := obj.GetAnnotations()[annTargetName]; name != "" {
		return []ctrl.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}}}
	}
	return nil
}

// eventsPoll is how often the events of an unbound prime or a pending worker
// are looked for.
const eventsPoll = 10 * time.Second

// annTargetName on a worker pod names the target claim, so that pod events
// reach the target's reconcile without a lookup.
const annTargetName = "kubefill.io/target-claim"

// Reconcile moves one target PVC a step along the populator flow.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := r.reconcile(ctx, req)
	if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		// The namespace and the claim in it are going away: not a failure.
		return ctrl.Result{}, nil
	}
	return res, err
}

func (r *Reconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	target := &corev1.PersistentVolumeClaim{}
	if err := r.Client.Get(ctx, req.NamespacedName, target); err != nil {
		// A deleted target takes its prime, and the prime its workers, through
		// owner references: nothing is left to do here.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !Handles(target, r.Kind.Name()) || target.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	primeName := PrimeName(target)
	prime := &corev1.PersistentVolumeClaim{}
	primeErr := r.Client.Get(ctx, types.NamespacedName{Namespace: target.Namespace, Name: primeName}, prime)
	if primeErr != nil && !apierrors.IsNotFound(primeErr) {
		return ctrl.Result{}, fmt.Errorf("reading prime %s: %w", primeName, primeErr)
	}
	primeExists := primeErr == nil

	// Already filled, or the filled volume is on its way to the target: only
	// the rebind and the cleanup are left.
	if !primeExists && (target.Annotations[cdiv1.AnnPopulatedFor] == target.Name || target.Status.Phase == corev1.ClaimBound) {
		return ctrl.Result{}, nil
	}
	if primeExists && HandedOver(target, prime) {
		if prime.DeletionTimestamp != nil {
			return ctrl.Result{}, nil // finish already ran
		}
		return r.rebind(ctx, target, prime)
	}

	if !primeExists {
		ready, requeue, err := r.checkPrerequisites(ctx, target)
		if err != nil || !ready {
			return ctrl.Result{RequeueAfter: requeue}, err
		}
	}

	source, err := r.Kind.GetSource(ctx, types.NamespacedName{Namespace: SourceNamespace(target), Name: target.Spec.DataSourceRef.Name})
	if apierrors.IsNotFound(err) {
		r.event(target, corev1.EventTypeWarning, "SourceMissing", "WaitForSource",
			fmt.Sprintf("%s %s not found; waiting for it to be created", r.Kind.Name(), target.Spec.DataSourceRef.Name))
		return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("reading %s %s: %w", r.Kind.Name(), target.Spec.DataSourceRef.Name, err)
	}

	if !primeExists {
		prime = NewPrime(target, r.Kind.Name())
		if err := r.Kind.PreparePrime(target, source, prime); err != nil {
			r.event(target, corev1.EventTypeWarning, "InvalidSource", "PreparePrime", err.Error())
			return ctrl.Result{}, r.setTargetAnnotations(ctx, target, map[string]string{
				cdiv1.AnnRunningCondition: "false", cdiv1.AnnRunningConditionReason: "InvalidSource", cdiv1.AnnRunningConditionMessage: err.Error(),
			})
		}
		if err := r.Client.Create(ctx, prime); err != nil && !apierrors.IsAlreadyExists(err) {
			return ctrl.Result{}, fmt.Errorf("creating prime %s: %w", primeName, err)
		}
		logger.Info("created PVC-prime", "prime", primeName)
		r.event(target, corev1.EventTypeNormal, "PrimeCreated", "CreatePrime", fmt.Sprintf("created PVC-prime %s to fill this claim", primeName))
		if err := r.setTargetAnnotations(ctx, target, map[string]string{cdiv1.AnnPVCPrimeName: primeName}); err != nil {
			return ctrl.Result{}, err
		}
	}

	if err := r.copyEvents(ctx, target, prime); err != nil {
		// Only the events are late; the population goes on.
		logger.Error(err, "copying the prime's and the workers' events to the claim")
	}
	state, err := r.Kind.Fill(ctx, target, prime, source)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("filling prime %s: %w", primeName, err)
	}
	if err := r.mirror(ctx, target, state); err != nil {
		return ctrl.Result{}, err
	}
	if !state.Done() {
		after := state.RetryAfter
		waiting := prime.Status.Phase != corev1.ClaimBound || state.Phase == corev1.PodPending
		if waiting && (after == 0 || after > eventsPoll) {
			// Nothing is watched that says why a prime stays unbound or a
			// worker pending: look for their events now and then.
			after = eventsPoll
		}
		return ctrl.Result{RequeueAfter: after}, nil
	}
	return r.rebind(ctx, target, prime)
}

// checkPrerequisites makes sure the target can be populated before a prime is
// made: a CSI StorageClass, and a chosen node when the class waits for one.
// When the target must wait it returns ready=false, and how long to wait
// (zero when a watch brings the target back, as the scheduler's choice does).
func (r *Reconciler) checkPrerequisites(ctx context.Context, target *corev1.PersistentVolumeClaim) (bool, time.Duration, error) {
	className := ""
	if target.Spec.StorageClassName != nil {
		className = *target.Spec.StorageClassName
	}
	if className == "" {
		r.event(target, corev1.EventTypeWarning, "NoStorageClass", "CheckStorageClass", "the claim names no StorageClass and the cluster has no default; a populated claim needs a CSI StorageClass")
		return false, time.Minute, nil
	}
	sc := &storagev1.StorageClass{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: className}, sc); err != nil {
		if apierrors.IsNotFound(err) {
			r.event(target, corev1.EventTypeWarning, "StorageClassMissing", "CheckStorageClass", fmt.Sprintf("StorageClass %s not found", className))
			return false, 30 * time.Second, nil
		}
		return false, 0, fmt.Errorf("reading StorageClass %s: %w", className, err)
	}
	if msg := UnsupportedClass(sc); msg != "" {
		r.event(target, corev1.EventTypeWarning, "UnsupportedStorageClass", "CheckStorageClass", msg)
		return false, 0, r.setTargetAnnotations(ctx, target, map[string]string{
			cdiv1.AnnRunningCondition: "false", cdiv1.AnnRunningConditionReason: "UnsupportedStorageClass", cdiv1.AnnRunningConditionMessage: msg,
		})
	}
	if WaitsForConsumer(target, sc) {
		// Watching the target brings us back when the scheduler picks a node.
		return false, 0, nil
	}
	return true, 0, nil
}

// mirror copies the worker's state onto the target with CDI's annotation keys,
// where the DataVolume controller and virtctl read it.
func (r *Reconciler) mirror(ctx context.Context, target *corev1.PersistentVolumeClaim, s WorkerState) error {
	running := "false"
	if s.Phase == corev1.PodRunning {
		running = "true"
	}
	ann := map[string]string{
		cdiv1.AnnPodPhase:                string(s.Phase),
		cdiv1.AnnPodReady:                strconv.FormatBool(s.Ready),
		cdiv1.AnnPodRestarts:             strconv.Itoa(int(s.Restarts)),
		cdiv1.AnnRunningCondition:        running,
		cdiv1.AnnRunningConditionReason:  s.Reason,
		cdiv1.AnnRunningConditionMessage: s.Message,
	}
	if s.Progress != "" {
		ann[cdiv1.AnnPopulatorProgress] = s.Progress
	}
	if s.Phase == corev1.PodFailed && s.Permanent && target.Annotations[cdiv1.AnnRunningConditionMessage] != s.Message {
		r.event(target, corev1.EventTypeWarning, s.Reason, "Fill", s.Message)
	}
	return r.setTargetAnnotations(ctx, target, ann)
}

// rebind hands the filled volume from the prime to the target, then cleans up.
func (r *Reconciler) rebind(ctx context.Context, target, prime *corev1.PersistentVolumeClaim) (ctrl.Result, error) {
	var pv *corev1.PersistentVolume
	if prime.Spec.VolumeName != "" {
		pv = &corev1.PersistentVolume{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: prime.Spec.VolumeName}, pv); err != nil {
			return ctrl.Result{}, fmt.Errorf("reading volume %s of prime %s: %w", prime.Spec.VolumeName, prime.Name, err)
		}
	}
	switch NextRebindStep(target, prime, pv) {
	case RebindWait:
		return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	case RebindConflict:
		msg := fmt.Sprintf("volume %s is claimed by neither this claim nor its prime %s; not rebinding", prime.Spec.VolumeName, prime.Name)
		r.event(target, corev1.EventTypeWarning, "RebindConflict", "Rebind", msg)
		return ctrl.Result{RequeueAfter: 30 * time.Second}, nil
	case RebindPatchClaimRef:
		patch := client.MergeFrom(pv.DeepCopy())
		pv.Spec.ClaimRef = &corev1.ObjectReference{
			Kind: "PersistentVolumeClaim", APIVersion: "v1",
			Namespace: target.Namespace, Name: target.Name, UID: target.UID, ResourceVersion: target.ResourceVersion,
		}
		if pv.Annotations == nil {
			pv.Annotations = map[string]string{}
		}
		pv.Annotations[cdiv1.AnnPopulatedFor] = target.Name
		if err := r.Client.Patch(ctx, pv, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("pointing volume %s at claim %s: %w", pv.Name, target.Name, err)
		}
		r.event(target, corev1.EventTypeNormal, "Rebind", "Rebind", fmt.Sprintf("volume %s filled; binding it to this claim", pv.Name))
		return ctrl.Result{RequeueAfter: time.Second}, nil
	case RebindWaitForBind:
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return r.finish(ctx, target, prime)
}

// finish runs once the target is bound to the filled volume: the workers and
// the prime go, and the target is marked populated.
func (r *Reconciler) finish(ctx context.Context, target, prime *corev1.PersistentVolumeClaim) (ctrl.Result, error) {
	retain := target.Annotations[cdiv1.AnnPodRetainAfterCompletion] == "true"
	if err := r.Kind.Cleanup(ctx, prime, retain); err != nil {
		return ctrl.Result{}, fmt.Errorf("cleaning up the workers of %s: %w", prime.Name, err)
	}
	if err := r.setTargetAnnotations(ctx, target, map[string]string{
		cdiv1.AnnPopulatedFor:      target.Name,
		cdiv1.AnnPopulatorProgress: FormatProgress(100, true),
	}); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.Client.Delete(ctx, prime); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("deleting prime %s: %w", prime.Name, err)
	}
	r.event(target, corev1.EventTypeNormal, "Populated", "Finish", "claim populated; temporary prime and workers removed")
	return ctrl.Result{}, nil
}

// setTargetAnnotations merges ann into the target's annotations when any differ.
func (r *Reconciler) setTargetAnnotations(ctx context.Context, target *corev1.PersistentVolumeClaim, ann map[string]string) error {
	changed := false
	for k, v := range ann {
		if target.Annotations[k] != v {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	patch := client.MergeFrom(target.DeepCopy())
	if target.Annotations == nil {
		target.Annotations = map[string]string{}
	}
	for k, v := range ann {
		target.Annotations[k] = v
	}
	if err := r.Client.Patch(ctx, target, patch); err != nil {
		return fmt.Errorf("annotating claim %s: %w", target.Name, err)
	}
	return nil
}

func (r *Reconciler) event(obj client.Object, eventType, reason, action, note string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(obj, nil, eventType, reason, action, "%s", note)
	}
}
