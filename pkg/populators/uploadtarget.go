package populators

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// IsUploadTarget says whether a claim asks for an upload the way CDI did
// before populators, and as `virtctl image-upload pvc` still does; see
// cdiv1.IsInPlaceUploadTarget.
func IsUploadTarget(pvc *corev1.PersistentVolumeClaim) bool { return cdiv1.IsInPlaceUploadTarget(pvc) }

// UploadTargetReconciler fills upload-target claims in place. It runs the
// upload populator's plan without the prime and the rebind (serving, then
// the upload pod on the claim itself) and reports on the claim the same way.
type UploadTargetReconciler struct {
	// Populator is the upload populator.
	Populator *Reconciler
}

// SetupWithManager registers r for upload-target claims and their upload pods.
func (r *UploadTargetReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("upload-target").
		For(&corev1.PersistentVolumeClaim{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
			pvc, ok := obj.(*corev1.PersistentVolumeClaim)
			return ok && IsUploadTarget(pvc)
		}))).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []ctrl.Request {
			return targetOf(obj)
		})).
		Complete(r)
}

// inPlacePlan is a plan without the phases that make and hand over a prime.
func inPlacePlan(plan []Phase) []Phase {
	var out []Phase
	for _, p := range plan {
		switch p.(type) {
		case *PrimePhase, *RebindPhase:
			continue
		}
		out = append(out, p)
	}
	return out
}

// Reconcile starts the claim's upload pod, mirrors its state onto the claim
// (storage.pod.ready, storage.pod.phase: what virtctl waits for), and
// removes the pod, its Service and its Secret once the upload succeeded.
func (r *UploadTargetReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	p := r.Populator
	pvc := &corev1.PersistentVolumeClaim{}
	if err := p.Client.Get(ctx, req.NamespacedName, pvc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !IsUploadTarget(pvc) || pvc.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	f := &Flow{Target: pvc, Prime: pvc, InPlace: true, Kind: p.Kind.Name(), Client: p.Client,
		PrimeKey: client.ObjectKeyFromObject(pvc),
		Event:    func(eventType, reason, action, note string) { p.event(pvc, eventType, reason, action, note) }}
	plan := inPlacePlan(p.Kind.Plan())
	retain := pvc.Annotations[cdiv1.AnnPodRetainAfterCompletion] == "true"
	if pvc.Annotations[cdiv1.AnnPodPhase] == string(corev1.PodSucceeded) {
		// Done earlier; the cleanup may not have finished.
		return ctrl.Result{}, cleanupPlan(ctx, f, plan, retain)
	}
	s, err := runPlan(ctx, f, plan)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("filling claim %s in place: %w", pvc.Name, err)
	}
	if s.result.Done && s.pod != nil {
		s.podResult.Progress = FormatProgress(100, true)
	}
	if err := p.report(ctx, pvc, s); err != nil {
		return ctrl.Result{}, err
	}
	if !s.result.Done {
		return ctrl.Result{RequeueAfter: s.result.RetryAfter}, nil
	}
	if err := cleanupPlan(ctx, f, plan, retain); err != nil {
		return ctrl.Result{}, fmt.Errorf("cleaning up the upload pod of %s: %w", pvc.Name, err)
	}
	p.event(pvc, corev1.EventTypeNormal, "UploadSucceeded", "Finish", "upload written to the claim; upload pod removed")
	return ctrl.Result{}, nil
}
