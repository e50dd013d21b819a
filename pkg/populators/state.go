package populators

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Kubefill's private annotations. Everything the populators remember between
// reconciles is here; CDI's public keys (storage.pod.phase, …) are mirrored
// on the target by the base and are not private.
const (
	// annAttempts on a prime counts the worker pods started for it.
	annAttempts = "kubefill.io/attempts"
	// annRetryNotBefore on a prime holds off the next worker until then (RFC 3339).
	annRetryNotBefore = "kubefill.io/retry-not-before"
	// annCopiedEvents on a prime lists the names of the events (its own and
	// its workers') already copied to the target, so that each is copied once.
	annCopiedEvents = "kubefill.io/copied-events"
	// annPhase on a target names the phase of its kind's plan it is in.
	annPhase = "kubefill.io/populator-phase"
	// annTargetName on a worker pod (and a prime in another namespace) names
	// the target claim, "name" or "namespace/name", so that their events
	// reach the target's reconcile without a lookup.
	annTargetName = "kubefill.io/target-claim"
)

// primeState is what the flow keeps on a prime (on the claim itself when it
// is filled in place), read and written as a whole.
type primeState struct {
	// Attempts counts the worker pods started.
	Attempts int
	// RetryNotBefore holds off the next worker pod; zero when none is pending.
	RetryNotBefore time.Time
	// CopiedEvents are the names of the events already shown on the target.
	CopiedEvents []string
	// key names the worker whose attempts these are (see workerKeys).
	key string
}

// parsePrimeState reads the state from a prime's annotations; what is
// missing or unreadable counts as zero.
func parsePrimeState(ann map[string]string) primeState { return parsePrimeStateFor(ann, "") }

// workerKeys are the annotations of one worker's attempts: key "" is the
// prime's one worker, another key one of several (annAttempts-key, …).
func workerKeys(key string) (attempts, retryNotBefore string) {
	if key == "" {
		return annAttempts, annRetryNotBefore
	}
	return annAttempts + "-" + key, annRetryNotBefore + "-" + key
}

// parsePrimeStateFor is parsePrimeState with the attempts of worker key.
func parsePrimeStateFor(ann map[string]string, key string) primeState {
	var s primeState
	s.key = key
	attempts, notBefore := workerKeys(key)
	s.Attempts, _ = strconv.Atoi(ann[attempts])
	if t, err := time.Parse(time.RFC3339, ann[notBefore]); err == nil {
		s.RetryNotBefore = t
	}
	if v := ann[annCopiedEvents]; v != "" {
		s.CopiedEvents = strings.Split(v, ",")
	}
	return s
}

// annotations renders the state; a zero field is written as "" only when the
// prime had it before (see savePrimeState), so a new prime stays clean.
func (s primeState) annotations() map[string]string {
	attempts, notBefore := workerKeys(s.key)
	ann := map[string]string{attempts: "", notBefore: "", annCopiedEvents: strings.Join(s.CopiedEvents, ",")}
	if s.Attempts > 0 {
		ann[attempts] = strconv.Itoa(s.Attempts)
	}
	if !s.RetryNotBefore.IsZero() {
		ann[notBefore] = s.RetryNotBefore.UTC().Format(time.RFC3339)
	}
	return ann
}

// savePrimeStateFor writes s as worker key's state (see workerKeys).
func savePrimeStateFor(ctx context.Context, c client.Client, prime client.Object, key string, s primeState) error {
	s.key = key
	return savePrimeState(ctx, c, prime, s)
}

// savePrimeState writes s to the prime in one patch, when anything changed.
func savePrimeState(ctx context.Context, c client.Client, prime client.Object, s primeState) error {
	ann := s.annotations()
	for k, v := range ann {
		if _, had := prime.GetAnnotations()[k]; v == "" && !had {
			delete(ann, k)
		}
	}
	return patchAnnotations(ctx, c, prime, ann)
}

// patchAnnotations merges ann into obj's annotations in one merge patch,
// and does nothing when none differs (a missing key equals ""). It is the one way the populators
// write annotations, on targets and primes alike.
func patchAnnotations(ctx context.Context, c client.Client, obj client.Object, ann map[string]string) error {
	current := obj.GetAnnotations()
	changed := false
	for k, v := range ann {
		if current[k] != v {
			changed = true
			break
		}
	}
	if !changed {
		return nil
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	merged := make(map[string]string, len(current)+len(ann))
	for k, v := range current {
		merged[k] = v
	}
	for k, v := range ann {
		merged[k] = v
	}
	obj.SetAnnotations(merged)
	if err := c.Patch(ctx, obj, patch); err != nil {
		return fmt.Errorf("annotating %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// targetRef is the annTargetName value for an object in namespace.
func targetRef(targetNamespace, targetName, namespace string) string {
	if targetNamespace == namespace {
		return targetName
	}
	return targetNamespace + "/" + targetName
}

// PatchAnnotations merges ann into obj's annotations in one merge patch, and
// does nothing when none differs: the populators' one way to write
// annotations, for kinds outside this package.
func PatchAnnotations(ctx context.Context, c client.Client, obj client.Object, ann map[string]string) error {
	return patchAnnotations(ctx, c, obj, ann)
}

// TargetAnnotation is the annotation that names the target claim on objects
// in another namespace (see TargetRef), which the flow maps back to it.
const TargetAnnotation = annTargetName

// TargetRef is the TargetAnnotation value for an object in namespace.
func TargetRef(targetNamespace, targetName, namespace string) string {
	return targetRef(targetNamespace, targetName, namespace)
}
