package populators

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// maxCopiedEvents bounds that list; a prime rarely has more than a handful.
const maxCopiedEvents = 50

// reasonClaimMisbound is the PV controller's warning on a claim whose
// volume's claimRef names another claim.
const reasonClaimMisbound = "ClaimMisbound"

// EventsToCopy picks the prime's events the target has not been shown yet,
// oldest first, and returns them with the updated list of copied names.
// ClaimMisbound is left out: the PV controller says it of the prime once its
// volume's claimRef names the target, which is the rebind itself, and the
// informer cache can show that event before it shows the target Bound.
func EventsToCopy(events []corev1.Event, copied string) ([]corev1.Event, string) {
	seen := strings.Split(copied, ",")
	if copied == "" {
		seen = nil
	}
	var out []corev1.Event
	for _, e := range events {
		if slices.Contains(seen, e.Name) || e.Reason == reasonClaimMisbound {
			continue
		}
		out = append(out, e)
		seen = append(seen, e.Name)
	}
	slices.SortStableFunc(out, func(a, b corev1.Event) int { return eventTime(a).Compare(eventTime(b)) })
	if len(seen) > maxCopiedEvents {
		seen = seen[len(seen)-maxCopiedEvents:]
	}
	return out, strings.Join(seen, ",")
}

// eventTime is when an event last happened, whichever API recorded it.
func eventTime(e corev1.Event) time.Time {
	t := e.FirstTimestamp.Time
	for _, c := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time} {
		if c.After(t) {
			t = c
		}
	}
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	return t
}

// copyEvents shows the target what happened to its prime (the provisioner
// failing, a quota refusing it) and the warnings of its worker pods while
// they wait (no node fits, a volume does not mount, the image does not
// pull): users otherwise never see these, on objects they did not make.
func (r *Reconciler) copyEvents(ctx context.Context, target, prime *corev1.PersistentVolumeClaim) error {
	if r.Events == nil || prime.UID == "" {
		return nil
	}
	found, err := r.eventsOf(ctx, prime, "PVC-prime "+prime.Name)
	if err != nil {
		return err
	}
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(prime.Namespace), client.MatchingLabels{cdiv1.LabelOwnedByUID: string(target.UID)}); err != nil {
		return fmt.Errorf("listing the workers of %s: %w", target.Name, err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Status.Phase != corev1.PodPending {
			continue
		}
		evs, err := r.eventsOf(ctx, pod, "pod "+pod.Name)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.Type == corev1.EventTypeWarning {
				found = append(found, e)
			}
		}
	}
	st := parsePrimeState(prime.Annotations)
	fresh, copied := EventsToCopy(found, strings.Join(st.CopiedEvents, ","))
	if len(fresh) == 0 {
		return nil
	}
	for _, e := range fresh {
		r.event(target, e.Type, e.Reason, "CopyEvent", e.Message)
	}
	st.CopiedEvents = strings.Split(copied, ",")
	if err := savePrimeState(ctx, r.Client, prime, st); err != nil {
		return fmt.Errorf("recording the events copied from prime %s: %w", prime.Name, err)
	}
	return nil
}

// eventsOf lists obj's events, their messages led by what ("PVC-prime x").
func (r *Reconciler) eventsOf(ctx context.Context, obj client.Object, what string) ([]corev1.Event, error) {
	list := &corev1.EventList{}
	if err := r.Events.List(ctx, list, client.InNamespace(obj.GetNamespace()), client.MatchingFields{"involvedObject.uid": string(obj.GetUID())}); err != nil {
		return nil, fmt.Errorf("listing the events of %s: %w", what, err)
	}
	for i := range list.Items {
		list.Items[i].Message = what + ": " + list.Items[i].Message
	}
	return list.Items, nil
}
