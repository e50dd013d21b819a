package populators

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

// ReasonErrCreatingScratch is the reason of a scratch claim a policy
// (not a quota) refused.
const ReasonErrCreatingScratch = "ErrCreatingScratchSpace"

// scratchWait is how soon a worker waiting for its scratch claim to go
// (an earlier attempt's) is looked at again.
const scratchWait = 5 * time.Second

// ensureScratch makes the scratch claim of the worker's attempt, before its
// pod, when the spec asks for scratch space: it returns the claim, or wait
// (the target's reason and message) when the pod must not start yet: a
// quota or policy refused the claim, or an earlier attempt's claim is still
// going. A claim of that name that is not this population's is never used.
func (w *WorkerPhase) ensureScratch(ctx context.Context, f *Flow, spec WorkerSpec, config *cdiv1.CDIConfig, attempt int) (*corev1.PersistentVolumeClaim, *Result, error) {
	if spec.Scratch == nil {
		return nil, nil, nil
	}
	d, err := DecideScratch(*spec.Scratch, f.Prime, config)
	if err != nil || !d.Needed {
		return nil, nil, err
	}
	want := NewScratchClaim(f.Target, f.Prime, spec.Component, d, attempt)
	have := &corev1.PersistentVolumeClaim{}
	err = w.Client.Get(ctx, client.ObjectKeyFromObject(want), have)
	switch {
	case err == nil && !ownScratch(f.Target, have):
		return nil, &Result{Reason: ReasonErrCreatingScratch, Event: corev1.EventTypeWarning, RetryAfter: 30 * time.Second,
			Message: fmt.Sprintf("cannot create the scratch claim of the %s: a claim %s/%s exists that does not belong to %s; rename or delete it",
				spec.Noun, have.Namespace, have.Name, f.Target.Name)}, nil
	case err == nil && have.DeletionTimestamp == nil && scratchAttempt(have) == attempt:
		return have, nil, nil
	case err == nil:
		// An earlier attempt's claim: it may hold what that attempt left.
		if have.DeletionTimestamp == nil {
			if err := w.deleteScratch(ctx, f); err != nil {
				return nil, nil, err
			}
		}
		return nil, &Result{Reason: ReasonCreatingScratch, RetryAfter: scratchWait,
			Message: fmt.Sprintf("the %s waits for the scratch claim %s/%s of its previous attempt to be deleted", spec.Noun, have.Namespace, have.Name)}, nil
	case !apierrors.IsNotFound(err):
		return nil, nil, fmt.Errorf("reading scratch claim %s/%s: %w", want.Namespace, want.Name, err)
	}
	if err := w.Client.Create(ctx, want); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, &Result{Reason: ReasonCreatingScratch, RetryAfter: time.Second, Message: "creating scratch space"}, nil
		}
		if q, ok := ParseQuotaExceeded(err); ok {
			return nil, &Result{Reason: ReasonExceededQuota, Event: corev1.EventTypeWarning, RetryAfter: QuotaRetry,
				Message: q.explainScratch(spec.Noun, want, f.Target)}, nil
		}
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			return nil, &Result{Reason: ReasonErrCreatingScratch, Event: corev1.EventTypeWarning, RetryAfter: 30 * time.Second,
				Message: fmt.Sprintf("cannot create the scratch claim %s/%s of the %s: %v", want.Namespace, want.Name, spec.Noun, err)}, nil
		}
		return nil, nil, fmt.Errorf("creating scratch claim %s/%s: %w", want.Namespace, want.Name, err)
	}
	size := want.Spec.Resources.Requests[corev1.ResourceStorage]
	f.event(corev1.EventTypeNormal, "ScratchSpaceCreated", "CreateScratch",
		fmt.Sprintf("created scratch claim %s (%s) for the %s", want.Name, size.String(), spec.Noun))
	return want, nil, nil
}

// ownScratch says whether claim is a scratch claim of target's population.
func ownScratch(target, claim *corev1.PersistentVolumeClaim) bool {
	return claim.Labels[cdiv1.LabelOwnedByUID] == string(target.UID) && claim.Annotations[annScratchAttempt] != ""
}

// deleteScratch deletes the population's scratch claim, if it has one; it
// goes once no pod uses it (the claim's protection finalizer).
func (w *WorkerPhase) deleteScratch(ctx context.Context, f *Flow) error {
	claim := &corev1.PersistentVolumeClaim{}
	key := types.NamespacedName{Namespace: f.Prime.Namespace, Name: cdiv1.ScratchClaimName(f.Prime.Name)}
	if err := w.Client.Get(ctx, key, claim); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading scratch claim %s/%s: %w", key.Namespace, key.Name, err)
	}
	if !ownScratch(f.Target, claim) || claim.DeletionTimestamp != nil {
		return nil
	}
	if err := w.Client.Delete(ctx, claim, client.Preconditions{UID: &claim.UID}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting scratch claim %s/%s: %w", key.Namespace, key.Name, err)
	}
	return nil
}

// explainScratchPending tells, of a pending worker whose scratch claim is
// not bound yet, that it waits for that claim.
func (w *WorkerPhase) explainScratchPending(ctx context.Context, f *Flow, pod *corev1.Pod, res *Result) error {
	name := podScratchClaim(pod)
	if name == "" {
		return nil
	}
	claim := &corev1.PersistentVolumeClaim{}
	if err := w.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, claim); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading scratch claim %s/%s: %w", pod.Namespace, name, err)
	}
	if claim.Status.Phase != corev1.ClaimBound {
		res.Reason, res.Message = ReasonCreatingScratch, scratchPendingMessage(nounOf(pod), claim)
	}
	return nil
}

// restartWithScratch replaces an importer that stopped because its image
// needs scratch space (a vmdk, say, found only once its first bytes were
// read): the prime is marked as requiring scratch, as CDI marks it, and the
// same attempt starts again with a scratch claim. It is not a failure: no
// retry is used up.
func (w *WorkerPhase) restartWithScratch(ctx context.Context, f *Flow, pod *corev1.Pod, st primeState, res Result) (Result, error) {
	if err := patchAnnotations(ctx, w.Client, f.Prime, map[string]string{cdiv1.AnnRequiresScratch: "true"}); err != nil {
		return Result{}, err
	}
	st.Attempts = max(st.Attempts-1, 0)
	st.RetryNotBefore = w.now()
	if err := savePrimeStateFor(ctx, w.Client, f.Prime, w.StateKey, st); err != nil {
		return Result{}, err
	}
	if err := w.Client.Delete(ctx, pod); client.IgnoreNotFound(err) != nil {
		return Result{}, fmt.Errorf("deleting worker pod %s: %w", pod.Name, err)
	}
	res.Pod.Phase, res.Pod.Ready = corev1.PodPending, false
	res.Reason = ReasonScratchRequired
	res.Message = fmt.Sprintf("the image needs scratch space to be converted; starting the %s again with a scratch claim", nounOf(pod))
	res.Permanent, res.Done, res.RetryAfter = false, false, time.Second
	return res, nil
}

// podScratchClaim is the scratch claim a worker pod mounts, or "".
func podScratchClaim(pod *corev1.Pod) string {
	for _, v := range pod.Spec.Volumes {
		if v.Name == contract.ScratchVolumeName && v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName
		}
	}
	return ""
}

// nounOf names a worker pod in messages, as its WorkerSpec's Noun does.
func nounOf(pod *corev1.Pod) string {
	switch pod.Labels[cdiv1.LabelComponent] {
	case "importer":
		return "importer pod"
	case "upload-server":
		return "upload pod"
	}
	return "worker pod"
}

// explainScratch says which quota refused a worker's scratch claim, in the
// style of Explain.
func (q *QuotaExceeded) explainScratch(noun string, claim, target *corev1.PersistentVolumeClaim) string {
	msg := q.Refused(claim.Namespace, fmt.Sprintf("scratch claim %s that the %s of %s spools the image to", claim.Name, noun, target.Name))
	return msg + "; while the image is converted, its scratch space counts against the quota beside the claim. " +
		"Nothing was started; this goes on by itself once the quota has room (raise it or free storage)"
}
