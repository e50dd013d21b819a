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
)

// RebindPhase hands the filled volume from the prime to the target: the
// volume's claimRef moves to the target, and the PV controller binds them.
// The claimRef checks compare namespace, name and UID of both claims, so a
// prime in another namespace (a clone's) is rebound the same way.
type RebindPhase struct{}

// Name implements Phase.
func (p *RebindPhase) Name() string { return "rebind" }

// Reconcile implements Phase: done once the target is bound to the very
// volume that holds the data.
func (p *RebindPhase) Reconcile(ctx context.Context, f *Flow) (Result, error) {
	target, prime := f.Target, f.Prime
	var pv *corev1.PersistentVolume
	if prime.Spec.VolumeName != "" {
		pv = &corev1.PersistentVolume{}
		if err := f.Client.Get(ctx, types.NamespacedName{Name: prime.Spec.VolumeName}, pv); err != nil {
			return Result{}, fmt.Errorf("reading volume %s of prime %s: %w", prime.Spec.VolumeName, prime.Name, err)
		}
	}
	switch NextRebindStep(target, prime, pv) {
	case RebindWait:
		return Result{RetryAfter: 2 * time.Second}, nil
	case RebindConflict:
		f.event(corev1.EventTypeWarning, "RebindConflict", "Rebind",
			fmt.Sprintf("volume %s is claimed by neither this claim nor its prime %s; not rebinding", prime.Spec.VolumeName, prime.Name))
		return Result{RetryAfter: 30 * time.Second}, nil
	case RebindPatchClaimRef:
		// The patch carries the volume's resourceVersion: when another
		// rebind (or the PV controller) changed it since it was read as the
		// prime's, the patch fails and the next reconcile decides again, so a
		// volume never moves to a claim it was not read for.
		patch := client.MergeFromWithOptions(pv.DeepCopy(), client.MergeFromWithOptimisticLock{})
		pv.Spec.ClaimRef = &corev1.ObjectReference{
			Kind: "PersistentVolumeClaim", APIVersion: "v1",
			Namespace: target.Namespace, Name: target.Name, UID: target.UID, ResourceVersion: target.ResourceVersion,
		}
		if pv.Annotations == nil {
			pv.Annotations = map[string]string{}
		}
		pv.Annotations[cdiv1.AnnPopulatedFor] = target.Name
		if err := f.Client.Patch(ctx, pv, patch); err != nil {
			if apierrors.IsConflict(err) {
				return Result{RetryAfter: time.Second}, nil
			}
			return Result{}, fmt.Errorf("pointing volume %s at claim %s: %w", pv.Name, target.Name, err)
		}
		f.event(corev1.EventTypeNormal, "Rebind", "Rebind", fmt.Sprintf("volume %s filled; binding it to this claim", pv.Name))
		return Result{RetryAfter: time.Second}, nil
	case RebindWaitForBind:
		return Result{RetryAfter: time.Second}, nil
	}
	return Result{Done: true}, nil
}
