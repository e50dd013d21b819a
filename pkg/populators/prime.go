package populators

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// PrimePhase makes the PVC-prime: the target's copy that the workers fill
// before its volume moves to the target.
type PrimePhase struct {
	// Prepare records on a new prime what the kind's worker needs from the
	// source. An error is the user's to fix and is shown on the target.
	Prepare func(target *corev1.PersistentVolumeClaim, source client.Object, prime *corev1.PersistentVolumeClaim) error
}

// Name implements Phase.
func (p *PrimePhase) Name() string { return "prime" }

// Reconcile implements Phase: done once the prime exists.
func (p *PrimePhase) Reconcile(ctx context.Context, f *Flow) (Result, error) {
	if f.Prime == nil {
		prime := newPrimeIn(f.Target, f.Kind, f.PrimeKey.Namespace)
		if f.PrimeKey.Name != "" {
			prime.Name = f.PrimeKey.Name
		}
		if p.Prepare != nil {
			if err := p.Prepare(f.Target, f.Source, prime); err != nil {
				return Result{Reason: "InvalidSource", Message: err.Error(), Permanent: true}, nil
			}
		}
		if err := f.Client.Create(ctx, prime); err != nil && !apierrors.IsAlreadyExists(err) {
			if q, ok := ParseQuotaExceeded(err); ok {
				// Nothing was made: the claim waits, and goes on by itself
				// once the quota has room (raised, or storage freed).
				return Result{Reason: ReasonExceededQuota, Event: corev1.EventTypeWarning, RetryAfter: QuotaRetry,
					Message: q.Explain(prime, f.Target)}, nil
			}
			if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
				// A policy refused it: the user can fix that.
				return Result{Reason: ReasonErrCreatingPVCPrime, Event: corev1.EventTypeWarning, RetryAfter: 30 * time.Second,
					Message: fmt.Sprintf("cannot create the temporary claim %s/%s: %v", prime.Namespace, prime.Name, err)}, nil
			}
			return Result{}, fmt.Errorf("creating prime %s: %w", prime.Name, err)
		}
		f.Prime = prime
		f.event(corev1.EventTypeNormal, "PrimeCreated", "CreatePrime", fmt.Sprintf("created PVC-prime %s to fill this claim", prime.Name))
		if ignored := IgnoredAcrossNamespaces(f.Target, prime.Namespace); len(ignored) > 0 {
			f.event(corev1.EventTypeWarning, ReasonIgnoredAcrossNamespaces, "CreatePrime", IgnoredAcrossNamespacesMessage(ignored, prime.Namespace))
		}
	}
	// Clients that follow storage.populator.pvcPrime (the upload proxy,
	// virtctl) find the prime through it.
	if err := patchAnnotations(ctx, f.Client, f.Target, map[string]string{cdiv1.AnnPVCPrimeName: f.Prime.Name}); err != nil {
		return Result{}, err
	}
	return Result{Done: true}, nil
}

// newPrimeIn is NewPrime for a prime in namespace. A prime in another
// namespace than its target's (a clone's, next to its source) cannot be
// owned by the target: it names its target in annTargetName instead, and
// the kind's Finalizer removes it.
func newPrimeIn(target *corev1.PersistentVolumeClaim, kind, namespace string) *corev1.PersistentVolumeClaim {
	prime := NewPrime(target, kind)
	if namespace != "" && namespace != target.Namespace {
		prime.Namespace = namespace
		prime.OwnerReferences = nil
		prime.Annotations[annTargetName] = targetRef(target.Namespace, target.Name, namespace)
		for _, key := range IgnoredAcrossNamespaces(target, namespace) {
			delete(prime.Annotations, key)
		}
	}
	return prime
}

// ReasonIgnoredAcrossNamespaces is the event reason of a claim whose
// requests for its worker pods are not applied in another namespace.
const ReasonIgnoredAcrossNamespaces = "IgnoredInSourceNamespace"

// acrossNamespaceIgnored are the claim's annotations about its worker pods
// that a flow whose prime and workers live in another namespace (a
// cross-namespace clone's, next to its source) does not apply there: the
// claim's user has no right to keep pods in that namespace
// (retainAfterCompletion), to choose their priority there, or to attach
// them to that namespace's networks. Mesh choices still apply: they only
// keep a sidecar out of, or put one into, the pod.
var acrossNamespaceIgnored = []string{cdiv1.AnnPodRetainAfterCompletion, cdiv1.AnnPriorityClassName,
	cdiv1.AnnPodNetwork, cdiv1.AnnPodMultusDefaultNetwork}

// IgnoredAcrossNamespaces are the annotations of target that are not
// applied to a prime and its workers in namespace, in order; none when
// namespace is the target's. Pure.
func IgnoredAcrossNamespaces(target *corev1.PersistentVolumeClaim, namespace string) []string {
	if namespace == "" || namespace == target.Namespace {
		return nil
	}
	var out []string
	for _, key := range acrossNamespaceIgnored {
		if _, ok := target.Annotations[key]; ok {
			out = append(out, key)
		}
	}
	return out
}

// IgnoredAcrossNamespacesMessage tells the claim's user which of its
// annotations were ignored, and why. Pure.
func IgnoredAcrossNamespacesMessage(keys []string, namespace string) string {
	return fmt.Sprintf("ignored %s: the temporary claim and the pods that fill this claim run in the source's namespace %s, "+
		"where this claim's annotations do not choose pod priority or networks, or keep pods after completion", strings.Join(keys, " and "), namespace)
}

// RetainWorkers says whether target's finished worker pods are kept
// (cdi.kubevirt.io/storage.pod.retainAfterCompletion), which they never
// are in another namespace than the target's (primeNamespace, a
// cross-namespace clone's source namespace): CDI avoids retaining pods in a
// namespace the claim's user has no right to. Pure.
func RetainWorkers(target *corev1.PersistentVolumeClaim, primeNamespace string) bool {
	return target.Annotations[cdiv1.AnnPodRetainAfterCompletion] == "true" && (primeNamespace == "" || primeNamespace == target.Namespace)
}

// Reasons of a prime that cannot be created, CDI's: ErrExceededQuota is
// what CDI reports for a claim a ResourceQuota refuses (and KubeVirt treats
// as an error), ErrCreatingPVCPrime its populators' event for any other
// refusal.
const (
	ReasonExceededQuota       = "ErrExceededQuota"
	ReasonErrCreatingPVCPrime = "ErrCreatingPVCPrime"
)

// QuotaRetry is how soon an object refused by a quota (a prime, a worker
// pod, a clone's temporary object) is tried again.
const QuotaRetry = 15 * time.Second

// QuotaExceeded is kube-apiserver's refusal by a ResourceQuota:
// "exceeded quota: <name>, requested: <list>, used: <list>, limited: <list>".
type QuotaExceeded struct {
	Quota                    string
	Requested, Used, Limited string
}

// ParseQuotaExceeded recognises a create refused by a ResourceQuota. It is
// pure.
func ParseQuotaExceeded(err error) (*QuotaExceeded, bool) {
	if err == nil || !apierrors.IsForbidden(err) {
		return nil, false
	}
	msg := err.Error()
	_, rest, ok := strings.Cut(msg, "exceeded quota: ")
	if !ok {
		return nil, false
	}
	q := &QuotaExceeded{}
	q.Quota, rest, _ = strings.Cut(rest, ", requested: ")
	q.Requested, rest, _ = strings.Cut(rest, ", used: ")
	q.Used, q.Limited, _ = strings.Cut(rest, ", limited: ")
	if q.Quota == "" {
		return nil, false
	}
	return q, true
}

// Refused is how every quota message starts: which ResourceQuota in which
// namespace has no room for what (object), and its figures. It is pure.
func (q *QuotaExceeded) Refused(namespace, object string) string {
	msg := fmt.Sprintf("exceeded quota: %s: the ResourceQuota %s in namespace %s has no room for the %s", q.Quota, q.Quota, namespace, object)
	if q.Requested != "" {
		msg += fmt.Sprintf(" (requested %s, used %s, limited %s)", q.Requested, q.Used, q.Limited)
	}
	return msg
}

// Explain says which quota refused the prime and what to do, in the words
// of the user's claim.
func (q *QuotaExceeded) Explain(prime, target *corev1.PersistentVolumeClaim) string {
	msg := q.Refused(prime.Namespace, fmt.Sprintf("temporary claim %s that fills %s", prime.Name, target.Name))
	if prime.Namespace == target.Namespace {
		msg += "; while it is filled, the claim's size counts twice against the quota"
	} else {
		msg += "; it lives next to the clone's source and counts against that namespace's quota"
	}
	return msg + ". Nothing was created; this goes on by itself once the quota has room (raise it or free storage)"
}
