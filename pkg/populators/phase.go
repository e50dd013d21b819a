package populators

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Kind is what one populator kind supplies to the shared reconciler: how to
// read its source, what to record on a new prime, and its plan, the ordered
// phases that fill the prime and hand its volume to the target.
type Kind interface {
	// Name is the dataSourceRef kind it fills, e.g. "VolumeImportSource".
	Name() string
	// GetSource reads the source object a target's dataSourceRef names.
	GetSource(ctx context.Context, key types.NamespacedName) (client.Object, error)
	// PreparePrime adds what the worker needs to a new prime, before it is
	// created. An error is the user's to fix: it is shown on the target.
	PreparePrime(target *corev1.PersistentVolumeClaim, source client.Object, prime *corev1.PersistentVolumeClaim) error
	// Plan lists the phases, in order. The base runs them on every reconcile
	// and stops at the first that is not done.
	Plan() []Phase
}

// Optional interfaces, checked by type assertion, for what only some kinds need.
type (
	// SourceAuthorizer decides itself whether a target may use a source in
	// another namespace (a clone token, say) instead of a ReferenceGrant;
	// err is a failure to decide.
	SourceAuthorizer interface {
		AuthorizeSource(ctx context.Context, target *corev1.PersistentVolumeClaim) (SourceVerdict, error)
	}
	// Watcher adds watches on the objects the kind makes, mapped back to the
	// target (see targetOf), beyond the prime and the worker pods.
	Watcher interface {
		Watches(b *builder.Builder) *builder.Builder
	}
	// Finalizer is for objects that owner references cannot reach: a prime or
	// a worker in the source's namespace. The base keeps FinalizerName on the
	// target while the kind runs, and calls Finalize once the target is being
	// deleted, before it lets the target go. Those objects carry the target's
	// UID in the cdi.kubevirt.io/OwnedByUID label, so Finalize finds them.
	Finalizer interface {
		FinalizerName() string
		Finalize(ctx context.Context, target *corev1.PersistentVolumeClaim) error
	}
	// Cleaner is a phase that leaves objects behind (a worker pod, a Service)
	// to remove once the target holds the data. retain (CDI's
	// pod.retainAfterCompletion) keeps the worker pod, detached.
	Cleaner interface {
		Cleanup(ctx context.Context, f *Flow, retain bool) error
	}
)

// Phase is one step of a kind's plan. Reconcile reads, decides and acts
// idempotently: it is called again on every reconcile until it says Done,
// and again after that while a later phase is not done.
type Phase interface {
	Name() string
	Reconcile(ctx context.Context, f *Flow) (Result, error)
}

// Result is where a phase stands.
type Result struct {
	// Done lets the flow go on to the next phase.
	Done bool
	// Progress is CDI's progress string ("45.20%"); empty keeps what the target shows.
	Progress string
	// Reason and Message explain the state for users (the running condition).
	Reason, Message string
	// Permanent says a failure will not be retried: the user must change something.
	Permanent bool
	// Event, when set (an event type, e.g. Warning), raises an event on the
	// target with Reason and Message, once per distinct message: a wait the
	// user can end (a source in use, a quota) is never silent.
	Event string
	// RetryAfter asks to look again after this long (backoff, progress polling).
	RetryAfter time.Duration
	// Pod is the worker pod's status, set only by phases that run a pod.
	Pod *PodStatus
}

// PodStatus is what the target shows of a worker pod (storage.pod.*).
type PodStatus struct {
	// Phase is the pod's phase; empty while no pod exists yet.
	Phase corev1.PodPhase
	// Ready is the worker's readiness (an upload server accepts data once ready).
	Ready bool
	// Restarts counts how often the worker was started again after failing.
	Restarts int32
}

// Flow is one target's population as the phases see it during a reconcile.
type Flow struct {
	// Target is the user's claim; Prime the PVC-prime filling it (nil until
	// the prime phase made it). For a claim filled in place both are the claim.
	Target, Prime *corev1.PersistentVolumeClaim
	// PrimeKey is where the prime lives: the target's namespace for import
	// and upload, the source's for a clone.
	PrimeKey types.NamespacedName
	// Source is the object the target's dataSourceRef names (nil in place).
	Source client.Object
	// InPlace marks a claim filled by its own worker, with no prime to rebind.
	InPlace bool
	// Kind is the kind whose plan runs.
	Kind string
	// Client, and Event to tell the target's user what happened.
	Client client.Client
	Event  func(eventType, reason, action, note string)
}

// HandedOver reports whether the prime's volume has started moving to the
// target: from then on only the rebind runs, never a worker again.
func (f *Flow) HandedOver() bool {
	return !f.InPlace && f.Prime != nil && HandedOver(f.Target, f.Prime)
}

func (f *Flow) event(eventType, reason, action, note string) {
	if f.Event != nil {
		f.Event(eventType, reason, action, note)
	}
}

// step is the outcome of running a plan: the phase it stopped at (or the
// last one), its result, and the pod status a worker phase reported on the way.
type step struct {
	phase  string
	result Result
	pod    *PodStatus
	// podResult is the result that carried pod, mirrored with it.
	podResult Result
}

// runPlan runs the phases in order and stops at the first one not done.
func runPlan(ctx context.Context, f *Flow, plan []Phase) (step, error) {
	var s step
	for _, p := range plan {
		res, err := p.Reconcile(ctx, f)
		if err != nil {
			return s, fmt.Errorf("%s phase: %w", p.Name(), err)
		}
		s.phase, s.result = p.Name(), res
		if res.Pod != nil {
			s.pod, s.podResult = res.Pod, res
		}
		if !res.Done {
			return s, nil
		}
	}
	return s, nil
}

// cleanupPlan runs every phase's cleanup, last phase first.
func cleanupPlan(ctx context.Context, f *Flow, plan []Phase, retain bool) error {
	for i := len(plan) - 1; i >= 0; i-- {
		if c, ok := plan[i].(Cleaner); ok {
			if err := c.Cleanup(ctx, f, retain); err != nil {
				return fmt.Errorf("cleaning up after the %s phase: %w", plan[i].Name(), err)
			}
		}
	}
	return nil
}

// SourceVerdict is the answer on a source in another namespace.
type SourceVerdict struct {
	Allowed bool
	// Message tells the user why the source is not used (yet).
	Message string
	// Pending: not refused, only not allowed yet, and what allows it is
	// under way and brings the target back (a DataVolume adds its claim's
	// clone token just after creating it). The claim says so, without a
	// warning.
	Pending bool
}
