package populators

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// annCopiedEvents on a prime lists the names of its events already copied to
// the target, so that each is copied once.
const annCopiedEvents = "kubefill.io/copied-events"

// maxCopiedEvents bounds that list; a prime rarely has more than a handful.
const maxCopiedEvents = 50

// EventsToCopy picks the prime's events the target has not been shown yet,
// oldest first, and returns them with the updated list of copied names.
func EventsToCopy(events []corev1.Event, copied string) ([]corev1.Event, string) {
	seen := strings.Split(copied, ",")
	if copied == "" {
		seen = nil
	}
	var out []corev1.Event
	for _, e := range events {
		if slices.Contains(seen, e.Name) {
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

// copyPrimeEvents shows the target what happened to its prime (the
// provisioner failing, a quota refusing it), which users otherwise never
// see: the prime is an object they did not make and rarely look at.
func (r *Reconciler) copyPrimeEvents(ctx context.Context, target, prime *corev1.PersistentVolumeClaim) error {
	if r.Events == nil || prime.UID == "" {
		return nil
	}
	list := &corev1.EventList{}
	if err := r.Events.List(ctx, list, client.InNamespace(prime.Namespace), client.MatchingFields{"involvedObject.uid": string(prime.UID)}); err != nil {
		return fmt.Errorf("listing the events of prime %s: %w", prime.Name, err)
	}
	fresh, copied := EventsToCopy(list.Items, prime.Annotations[annCopiedEvents])
	if len(fresh) == 0 {
		return nil
	}
	for _, e := range fresh {
		r.event(target, e.Type, e.Reason, "CopyFromPrime", fmt.Sprintf("PVC-prime %s: %s", prime.Name, e.Message))
	}
	patch := client.MergeFrom(prime.DeepCopy())
	if prime.Annotations == nil {
		prime.Annotations = map[string]string{}
	}
	prime.Annotations[annCopiedEvents] = copied
	if err := r.Client.Patch(ctx, prime, patch); err != nil {
		return fmt.Errorf("recording the events copied from prime %s: %w", prime.Name, err)
	}
	return nil
}
