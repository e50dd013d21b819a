package populators

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// Reconciler is the populator flow shared by every kind: for a PVC whose
// dataSourceRef names its kind it checks the claim can be filled, reads the
// source, runs the kind's plan (a PVC-prime, the kind's phases, the rebind
// of the filled volume to the PVC) and removes the prime.
type Reconciler struct {
	Client   client.Client
	Recorder recorder.EventRecorder
	Kind     Kind
	// Events reads the prime's events (uncached, by field selector) to copy
	// them to the target; nil copies none.
	Events client.Reader
	// Grants decides whether a claim may use a source in another namespace
	// (a *GrantChecker reads ReferenceGrants), unless the kind is a
	// SourceAuthorizer. nil refuses every cross-namespace source.
	Grants interface {
		Allowed(ctx context.Context, target *corev1.PersistentVolumeClaim) (bool, string, error)
	}
}

// SetupWithManager registers r for PVCs, following their primes and the
// objects the primes own (worker pods) back to the target.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	kind := r.Kind.Name()
	toTarget := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []ctrl.Request {
		return targetOf(obj)
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named("populator-"+kind).
		For(&corev1.PersistentVolumeClaim{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
			pvc, ok := obj.(*corev1.PersistentVolumeClaim)
			return ok && Handles(pvc, kind)
		}))).
		Watches(&corev1.PersistentVolumeClaim{}, toTarget).
		Watches(&corev1.Pod{}, toTarget)
	if w, ok := r.Kind.(Watcher); ok {
		b = w.Watches(b)
	}
	return b.Complete(r)
}

// targetOf maps a prime, or a worker naming its target, to the target's
// request. Primes in the target's namespace name it in their owner reference.
func targetOf(obj client.Object) []ctrl.Request {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.Kind == "PersistentVolumeClaim" && ref.Controller != nil && *ref.Controller {
			if _, isPVC := obj.(*corev1.PersistentVolumeClaim); isPVC {
				return []ctrl.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}}}
			}
		}
	}
	if ref := obj.GetAnnotations()[annTargetName]; ref != "" {
		ns, name, cross := strings.Cut(ref, "/")
		if !cross {
			ns, name = obj.GetNamespace(), ref
		}
		return []ctrl.Request{{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
	}
	return nil
}

// eventsPoll is how often the events of an unbound prime or a pending worker
// are looked for.
const eventsPoll = 10 * time.Second

// sourceAuthPoll is how often a refused cross-namespace source is checked
// again: a ReferenceGrant may appear.
const sourceAuthPoll = 30 * time.Second

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
	target := &corev1.PersistentVolumeClaim{}
	if err := r.Client.Get(ctx, req.NamespacedName, target); err != nil {
		// A deleted target takes its prime, and the prime its workers, through
		// owner references: nothing is left to do here.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !Handles(target, r.Kind.Name()) {
		return ctrl.Result{}, nil
	}
	if fin, ok := r.Kind.(Finalizer); ok {
		if stop, err := r.finalize(ctx, target, fin); stop || err != nil {
			return ctrl.Result{}, err
		}
	}
	if target.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	f := &Flow{Target: target, PrimeKey: r.primeKey(target), Kind: r.Kind.Name(), Client: r.Client,
		Event: func(eventType, reason, action, note string) { r.event(target, eventType, reason, action, note) }}
	prime := &corev1.PersistentVolumeClaim{}
	if err := r.Client.Get(ctx, f.PrimeKey, prime); err == nil {
		f.Prime = prime
	} else if !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("reading prime %s: %w", f.PrimeKey.Name, err)
	}

	switch {
	case f.Prime == nil && filled(target):
		// Already filled: the prime is gone. A kind's Finalizer removes what
		// is left in other namespaces, and its finalizer goes.
		if fin, ok := r.Kind.(Finalizer); ok {
			return ctrl.Result{}, r.release(ctx, target, fin)
		}
		return ctrl.Result{}, nil
	case f.Prime != nil && f.Prime.DeletionTimestamp != nil:
		// finish already ran (or the prime is going away)
		if fin, ok := r.Kind.(Finalizer); ok && filled(target) {
			return ctrl.Result{}, r.release(ctx, target, fin)
		}
		return ctrl.Result{}, nil
	case f.Prime == nil:
		ready, requeue, err := r.checkPrerequisites(ctx, target)
		if err != nil || !ready {
			return ctrl.Result{RequeueAfter: requeue}, err
		}
	}

	// Once the volume is on its way to the target, only the rebind and the
	// cleanup are left: the source is not needed (it may be gone).
	if !f.HandedOver() {
		if IsCrossNamespace(target) {
			verdict, err := r.authorizeSource(ctx, target)
			if err != nil {
				return ctrl.Result{}, fmt.Errorf("authorising the source of %s: %w", target.Name, err)
			}
			if verdict.Pending {
				return ctrl.Result{RequeueAfter: sourceAuthPoll}, r.awaitSource(ctx, target, verdict.Message)
			}
			if msg := verdict.Message; !verdict.Allowed {
				if f.Prime != nil && CleansWhenRefused(target) {
					// Allowed before, refused now: the grant was revoked
					// mid-flow. What was copied under it goes.
					if err := r.revoke(ctx, f); err != nil {
						return ctrl.Result{}, fmt.Errorf("stopping the population of %s after its source was refused: %w", target.Name, err)
					}
					msg = RevokedMessage(msg, f.Prime)
				}
				return ctrl.Result{RequeueAfter: sourceAuthPoll}, r.refuseSource(ctx, target, msg)
			}
		}
		source, err := r.Kind.GetSource(ctx, types.NamespacedName{Namespace: SourceNamespace(target), Name: target.Spec.DataSourceRef.Name})
		if apierrors.IsNotFound(err) {
			msg := fmt.Sprintf("%s %s not found; waiting for it to be created", r.Kind.Name(), target.Spec.DataSourceRef.Name)
			if IsCrossNamespace(target) {
				msg = fmt.Sprintf("%s %s/%s not found in the source namespace %s; waiting for it to be created",
					r.Kind.Name(), SourceNamespace(target), target.Spec.DataSourceRef.Name, SourceNamespace(target))
			}
			r.event(target, corev1.EventTypeWarning, "SourceMissing", "WaitForSource", msg)
			// The claim says so too: a source gone mid-flow (its namespace
			// deleted) leaves no worker whose state would still show as running.
			return ctrl.Result{RequeueAfter: 10 * time.Second}, patchAnnotations(ctx, r.Client, target, map[string]string{
				cdiv1.AnnRunningCondition: "false", cdiv1.AnnRunningConditionReason: "SourceMissing", cdiv1.AnnRunningConditionMessage: msg,
			})
		}
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("reading %s %s: %w", r.Kind.Name(), target.Spec.DataSourceRef.Name, err)
		}
		f.Source = source
	}

	plan := r.Kind.Plan()
	s, err := runPlan(ctx, f, plan)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("populating claim %s: %w", target.Name, err)
	}
	if f.Prime != nil && !f.HandedOver() {
		if err := r.copyEvents(ctx, target, f.Prime); err != nil {
			// Only the events are late; the population goes on.
			log.FromContext(ctx).Error(err, "copying the prime's and the workers' events to the claim")
		}
	}
	if err := r.report(ctx, target, s); err != nil {
		return ctrl.Result{}, err
	}
	if !s.result.Done {
		after := s.result.RetryAfter
		waiting := f.Prime != nil && (f.Prime.Status.Phase != corev1.ClaimBound || (s.pod != nil && s.pod.Phase == corev1.PodPending))
		if waiting && (after == 0 || after > eventsPoll) {
			// Nothing is watched that says why a prime stays unbound or a
			// worker pending: look for their events now and then.
			after = eventsPoll
		}
		return ctrl.Result{RequeueAfter: after}, nil
	}
	return ctrl.Result{}, r.finish(ctx, f, plan)
}

// PrimeLocator is a kind whose prime lives elsewhere than its target's
// namespace (a clone's, next to its source).
type PrimeLocator interface {
	PrimeNamespace(target *corev1.PersistentVolumeClaim) string
}

// PhaseReporter is a kind that shows more of where its plan stands on the
// target (a clone's cdi.kubevirt.io/clonePhase): the annotations it returns
// are written with the base's, and win. phase is the phase the run stopped
// at (the last one, with res.Done, once every phase is done).
type PhaseReporter interface {
	PhaseAnnotations(target *corev1.PersistentVolumeClaim, phase string, res Result) map[string]string
}

// PrimeNamer is a kind whose prime has another name than prime-<UID> (a
// clone's tmp-pvc-<UID>, CDI's name).
type PrimeNamer interface {
	PrimeNameFor(target *corev1.PersistentVolumeClaim) string
}

// PrimeKey is where kind keeps target's prime.
func PrimeKey(kind Kind, target *corev1.PersistentVolumeClaim) types.NamespacedName {
	key := types.NamespacedName{Namespace: target.Namespace, Name: PrimeName(target)}
	if l, ok := kind.(PrimeLocator); ok {
		key.Namespace = l.PrimeNamespace(target)
	}
	if n, ok := kind.(PrimeNamer); ok {
		key.Name = n.PrimeNameFor(target)
	}
	return key
}

func (r *Reconciler) primeKey(target *corev1.PersistentVolumeClaim) types.NamespacedName {
	return PrimeKey(r.Kind, target)
}

// authorizeSource asks the kind, or else the ReferenceGrants, whether target
// may use a source in another namespace. Nothing there is read before.
func (r *Reconciler) authorizeSource(ctx context.Context, target *corev1.PersistentVolumeClaim) (SourceVerdict, error) {
	if a, ok := r.Kind.(SourceAuthorizer); ok {
		return a.AuthorizeSource(ctx, target)
	}
	if r.Grants == nil {
		ref := target.Spec.DataSourceRef
		return SourceVerdict{Message: fmt.Sprintf("%s %s/%s is in another namespace than the claim, and this controller checks no ReferenceGrants: cross-namespace sources are refused",
			ref.Kind, SourceNamespace(target), ref.Name)}, nil
	}
	allowed, msg, err := r.Grants.Allowed(ctx, target)
	return SourceVerdict{Allowed: allowed, Message: msg}, err
}

// revoke undoes a population whose cross-namespace source is refused after
// it started (its ReferenceGrant was deleted or changed): the workers and
// whatever the plan made go, then the kind's temporary objects in the
// source's namespace, then the prime with the data it received, so nothing
// copied under the grant stays readable. A grant given again starts the
// population over: the prime and everything on it are new.
func (r *Reconciler) revoke(ctx context.Context, f *Flow) error {
	target, prime := f.Target, f.Prime
	if err := cleanupPlan(ctx, f, r.Kind.Plan(), false); err != nil {
		return err
	}
	if fin, ok := r.Kind.(Finalizer); ok {
		if err := fin.Finalize(ctx, target); err != nil {
			return err
		}
	}
	if err := r.Client.Delete(ctx, prime); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting prime %s/%s: %w", prime.Namespace, prime.Name, err)
	}
	r.event(target, corev1.EventTypeWarning, ReasonSourceRevoked, "AuthorizeSource", RevokedMessage("", prime))
	// Nothing runs any more: the claim must not say a worker is ready.
	return patchAnnotations(ctx, r.Client, target, map[string]string{
		cdiv1.AnnPodPhase: "", cdiv1.AnnPodReady: "false", cdiv1.AnnPopulatorProgress: FormatProgress(0, false),
	})
}

// ReasonSourceRevoked is the event of a population stopped because its
// cross-namespace source was refused after it started.
const ReasonSourceRevoked = "SourceAccessRevoked"

// CleansWhenRefused says whether a population of target that has started
// is undone when its source is refused: a source a ReferenceGrant allowed
// (the grant was revoked). A clone authorised by a clone token
// (cdi.kubevirt.io/dataSourceNamespace) is not: its short token expires by
// design, and the extended token is bound to the claim. Pure.
func CleansWhenRefused(target *corev1.PersistentVolumeClaim) bool {
	return IsCrossNamespace(target) && AnnotatedSourceNamespace(target) == ""
}

// RevokedMessage is refusal (the grant check's message) with what was
// undone: the workers stopped and the prime deleted with its data. Pure.
func RevokedMessage(refusal string, prime *corev1.PersistentVolumeClaim) string {
	msg := fmt.Sprintf("the source is no longer allowed: the worker pods were stopped and the temporary claim %s/%s was deleted with the data it had received; "+
		"the population starts over once a ReferenceGrant allows the source again", prime.Namespace, prime.Name)
	if refusal == "" {
		return msg
	}
	return refusal + "; " + msg
}

// ReasonSourcePending is the running condition's reason while a
// cross-namespace source waits for an authorisation already under way.
const ReasonSourcePending = "SourceAuthorizationPending"

// awaitSource says on the claim what its source waits for: the running
// condition only, no event, since nothing is wrong.
func (r *Reconciler) awaitSource(ctx context.Context, target *corev1.PersistentVolumeClaim, msg string) error {
	return patchAnnotations(ctx, r.Client, target, map[string]string{
		cdiv1.AnnRunningCondition: "false", cdiv1.AnnRunningConditionReason: ReasonSourcePending, cdiv1.AnnRunningConditionMessage: msg,
	})
}

// refuseSource tells the user why a cross-namespace source is not used: an
// event (when the reason is new) and the running condition.
func (r *Reconciler) refuseSource(ctx context.Context, target *corev1.PersistentVolumeClaim, msg string) error {
	if target.Annotations[cdiv1.AnnRunningConditionMessage] != msg {
		r.event(target, corev1.EventTypeWarning, "SourceNotAuthorized", "AuthorizeSource", msg)
	}
	return patchAnnotations(ctx, r.Client, target, map[string]string{
		cdiv1.AnnRunningCondition: "false", cdiv1.AnnRunningConditionReason: "SourceNotAuthorized", cdiv1.AnnRunningConditionMessage: msg,
	})
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
		return false, 0, patchAnnotations(ctx, r.Client, target, map[string]string{
			cdiv1.AnnRunningCondition: "false", cdiv1.AnnRunningConditionReason: "UnsupportedStorageClass", cdiv1.AnnRunningConditionMessage: msg,
		})
	}
	config := &cdiv1.CDIConfig{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); err != nil {
		if !apierrors.IsNotFound(err) {
			return false, 0, fmt.Errorf("reading CDIConfig for its feature gates: %w", err)
		}
		config = nil
	}
	if WaitsForConsumer(target, sc, cdiv1.HonorsWaitForFirstConsumer(config)) {
		// Watching the target brings us back when the scheduler picks a node.
		return false, 0, nil
	}
	return true, 0, nil
}

// report writes where the flow stands onto the target with CDI's annotation
// keys, where the DataVolume controller and virtctl read it: the worker
// pod's status (storage.pod.*) when a worker phase ran, the running
// condition from the worker or from the phase that stopped the flow with a
// reason, and the phase's name. A new permanent failure is also an event.
func (r *Reconciler) report(ctx context.Context, target *corev1.PersistentVolumeClaim, s step) error {
	ann := map[string]string{annPhase: s.phase}
	if p := s.pod; p != nil {
		running := "false"
		if p.Phase == corev1.PodRunning {
			running = "true"
		}
		ann[cdiv1.AnnPodPhase] = string(p.Phase)
		ann[cdiv1.AnnPodReady] = strconv.FormatBool(p.Ready)
		ann[cdiv1.AnnPodRestarts] = strconv.Itoa(int(p.Restarts))
		ann[cdiv1.AnnRunningCondition] = running
		ann[cdiv1.AnnRunningConditionReason] = s.podResult.Reason
		ann[cdiv1.AnnRunningConditionMessage] = s.podResult.Message
		if s.podResult.Progress != "" {
			ann[cdiv1.AnnPopulatorProgress] = s.podResult.Progress
		}
	}
	if res := s.result; !res.Done && res.Pod == nil && res.Reason != "" {
		ann[cdiv1.AnnRunningCondition] = "false"
		ann[cdiv1.AnnRunningConditionReason] = res.Reason
		ann[cdiv1.AnnRunningConditionMessage] = res.Message
		if res.Progress != "" {
			ann[cdiv1.AnnPopulatorProgress] = res.Progress
		}
	}
	if res := s.result; (res.Permanent || res.Event != "") && !res.Done && target.Annotations[cdiv1.AnnRunningConditionMessage] != res.Message {
		eventType := res.Event
		if eventType == "" {
			eventType = corev1.EventTypeWarning
		}
		r.event(target, eventType, res.Reason, s.phase, res.Message)
	}
	if rep, ok := r.Kind.(PhaseReporter); ok {
		for k, v := range rep.PhaseAnnotations(target, s.phase, s.result) {
			ann[k] = v
		}
	}
	return patchAnnotations(ctx, r.Client, target, ann)
}

// finish runs once every phase is done, the target bound to the filled
// volume: the phases clean up, the target is marked populated, the prime goes.
func (r *Reconciler) finish(ctx context.Context, f *Flow, plan []Phase) error {
	target, prime := f.Target, f.Prime
	retain := RetainWorkers(target, prime.Namespace)
	if err := cleanupPlan(ctx, f, plan, retain); err != nil {
		return fmt.Errorf("cleaning up the workers of %s: %w", prime.Name, err)
	}
	if err := patchAnnotations(ctx, r.Client, target, map[string]string{
		cdiv1.AnnPopulatedFor:      target.Name,
		cdiv1.AnnPopulatorProgress: FormatProgress(100, true),
	}); err != nil {
		return err
	}
	if err := r.Client.Delete(ctx, prime); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting prime %s: %w", prime.Name, err)
	}
	r.event(target, corev1.EventTypeNormal, "Populated", "Finish", "claim populated; temporary prime and workers removed")
	if fin, ok := r.Kind.(Finalizer); ok {
		return r.release(ctx, target, fin)
	}
	return nil
}

// finalize keeps the kind's finalizer on a live target and, once the target
// is being deleted, lets the kind remove what owner references cannot reach
// before it lets the target go. stop says the reconcile is over.
func (r *Reconciler) finalize(ctx context.Context, target *corev1.PersistentVolumeClaim, fin Finalizer) (stop bool, err error) {
	name := fin.FinalizerName()
	has := controllerutil.ContainsFinalizer(target, name)
	if target.DeletionTimestamp == nil {
		if has || filled(target) {
			return false, nil
		}
		patch := client.MergeFrom(target.DeepCopy())
		controllerutil.AddFinalizer(target, name)
		if err := r.Client.Patch(ctx, target, patch); err != nil {
			return true, fmt.Errorf("adding finalizer %s to claim %s: %w", name, target.Name, err)
		}
		return false, nil
	}
	if !has {
		return true, nil
	}
	return true, r.release(ctx, target, fin)
}

// filled reports whether target holds its data (or was bound by someone else).
func filled(target *corev1.PersistentVolumeClaim) bool {
	return target.Annotations[cdiv1.AnnPopulatedFor] == target.Name || target.Status.Phase == corev1.ClaimBound
}

// release lets the kind remove what owner references cannot reach, then
// removes its finalizer from target.
func (r *Reconciler) release(ctx context.Context, target *corev1.PersistentVolumeClaim, fin Finalizer) error {
	name := fin.FinalizerName()
	if !controllerutil.ContainsFinalizer(target, name) {
		return nil
	}
	if err := fin.Finalize(ctx, target); err != nil {
		return fmt.Errorf("finalizing claim %s: %w", target.Name, err)
	}
	patch := client.MergeFrom(target.DeepCopy())
	controllerutil.RemoveFinalizer(target, name)
	if err := r.Client.Patch(ctx, target, patch); err != nil {
		return fmt.Errorf("removing finalizer %s from claim %s: %w", name, target.Name, err)
	}
	return nil
}

func (r *Reconciler) event(obj client.Object, eventType, reason, action, note string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(obj, nil, eventType, reason, action, "%s", note)
	}
}

// TargetRequests maps an object the flow made (a prime, a worker, or a
// kind's object naming its target in TargetAnnotation) to its target's
// request, for a kind's Watcher.
func TargetRequests(obj client.Object) []ctrl.Request { return targetOf(obj) }
