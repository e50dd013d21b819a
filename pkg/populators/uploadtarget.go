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
// before populators, and as `virtctl image-upload pvc` still does: annotated
// cdi.kubevirt.io/storage.upload.target, with no dataSourceRef. Such a claim
// is filled in place by an upload pod that mounts it; there is no prime.
// A populator's PVC-prime carries the annotation too (clients follow
// storage.populator.pvcPrime to it), but the populator fills it.
func IsUploadTarget(pvc *corev1.PersistentVolumeClaim) bool {
	_, annotated := pvc.Annotations[cdiv1.AnnUploadRequest]
	_, prime := pvc.Annotations[cdiv1.AnnPopulatorKind]
	return annotated && !prime && pvc.Spec.DataSourceRef == nil && pvc.Spec.DataSource == nil
}

// UploadTargetReconciler fills upload-target claims in place. It shares the
// upload populator's kind (pod, Service, Secret, progress) and the way it
// reports on the claim; only the prime and the rebind are left out.
type UploadTargetReconciler struct {
	// Populator is the upload populator; its Kind must be an *UploadKind.
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
	retain := pvc.Annotations[cdiv1.AnnPodRetainAfterCompletion] == "true"
	if pvc.Annotations[cdiv1.AnnPodPhase] == string(corev1.PodSucceeded) {
		// Done earlier; the cleanup may not have finished.
		return ctrl.Result{}, p.Kind.Cleanup(ctx, pvc, retain)
	}
	state, err := p.Kind.Fill(ctx, pvc, pvc, nil)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("filling claim %s in place: %w", pvc.Name, err)
	}
	if state.Done() {
		state.Progress = FormatProgress(100, true)
	}
	if err := p.mirror(ctx, pvc, state); err != nil {
		return ctrl.Result{}, err
	}
	if !state.Done() {
		return ctrl.Result{RequeueAfter: state.RetryAfter}, nil
	}
	if err := p.Kind.Cleanup(ctx, pvc, retain); err != nil {
		return ctrl.Result{}, fmt.Errorf("cleaning up the upload pod of %s: %w", pvc.Name, err)
	}
	p.event(pvc, corev1.EventTypeNormal, "UploadSucceeded", "Finish", "upload written to the claim; upload pod removed")
	return ctrl.Result{}, nil
}
