package clone

import (
	"context"
	"fmt"
	"strings"
	"sync"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/source"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/pkg/token"
)

// Kind is the clone populator: it fills a claim whose dataSourceRef names a
// VolumeCloneSource with a copy of the source claim or VolumeSnapshot that
// the VolumeCloneSource names, in the source's namespace. Its prime,
// tmp-pvc-<target UID>, and every temporary object live in the source's
// namespace; the base's rebind hands the prime's volume to the target.
//
// The plan is CDI's, chosen once (Plan) and pinned on the target:
// Pending → [Snapshot] → [SnapshotClone | CSIClone] → prime → [PrepClaim]
// → [HostClone] → Rebind; each phase not in the strategy's plan is skipped.
type Kind struct {
	Client client.Client
	// Reader reads Secrets without a cache; nil uses Client.
	Reader client.Reader
	// Namespace is the controller's install namespace, where the upload CAs live.
	Namespace string
	// Image is the container image holding the kubefill binary.
	Image      string
	PullPolicy corev1.PullPolicy
	// ExtendedTokens validates the extended clone token (issuer
	// cdi-deployment), the only one accepted on a claim. nil refuses every
	// cross-namespace clone authorised by a token.
	ExtendedTokens token.Validator
	// Grants decides for a claim whose dataSourceRef itself names another
	// namespace (no cdi.kubevirt.io/dataSourceNamespace): a ReferenceGrant
	// must allow it. nil refuses those.
	Grants interface {
		Allowed(ctx context.Context, target *corev1.PersistentVolumeClaim) (bool, string, error)
	}
	// Snapshots says snapshot.storage.k8s.io/v1 is served and in the
	// client's scheme; without it only the copy strategy is possible.
	Snapshots bool
	// ScrapeProgress reads a clone source pod's progress; nil uses HTTPS to
	// the pod's metrics port.
	ScrapeProgress func(ctx context.Context, pod *corev1.Pod, port int32) (float64, error)

	outcomesOnce sync.Once
	outcomes     *uploadOutcomes // see uploadOutcomesOf
}

// uploadOutcomesOf is the kind's watch of its upload servers' outcomes.
func (k *Kind) uploadOutcomesOf() *uploadOutcomes {
	k.outcomesOnce.Do(func() { k.outcomes = newUploadOutcomes() })
	return k.outcomes
}

// Name implements populators.Kind.
func (k *Kind) Name() string { return cdiv1.VolumeCloneSourceRef }

// GetSource implements populators.Kind.
func (k *Kind) GetSource(ctx context.Context, key types.NamespacedName) (client.Object, error) {
	src := &cdiv1.VolumeCloneSource{}
	if err := k.Client.Get(ctx, key, src); err != nil {
		return nil, err
	}
	return src, nil
}

// PreparePrime implements populators.Kind; the plan's prime phase uses the
// reconcile's own preparation (run.preparePrime), which knows the strategy.
func (k *Kind) PreparePrime(*corev1.PersistentVolumeClaim, client.Object, *corev1.PersistentVolumeClaim) error {
	return fmt.Errorf("the clone prime is prepared by its plan")
}

// Plan implements populators.Kind. The phases of one reconcile share what
// the Pending phase read and decided.
func (k *Kind) Plan() []populators.Phase {
	r := &run{k: k}
	return []populators.Phase{
		&planPhase{run: r},
		&snapshotPhase{run: r},
		&gatePhase{run: r},
		&primePhase{run: r, prime: &populators.PrimePhase{Prepare: r.preparePrime}},
		&prepClaimPhase{run: r},
		newHostClonePhase(r),
		&named{Phase: &populators.RebindPhase{}, name: PhaseRebind},
	}
}

// PrimeNamespace implements populators.PrimeLocator: next to the source.
func (k *Kind) PrimeNamespace(target *corev1.PersistentVolumeClaim) string {
	return populators.SourceNamespace(target)
}

// PrimeNameFor implements populators.PrimeNamer: CDI's tmp-pvc-<target UID>.
func (k *Kind) PrimeNameFor(target *corev1.PersistentVolumeClaim) string {
	return TmpClaimName(target.UID)
}

// FinalizerName implements populators.Finalizer.
func (k *Kind) FinalizerName() string { return cdiv1.FinalizerClonePopulator }

// Finalize implements populators.Finalizer: it removes the temporary
// objects of target in the source's namespace (claims, pods, snapshots
// labelled with its UID; the Secrets and Service named after them). The
// source itself never carries that label and is never touched.
func (k *Kind) Finalize(ctx context.Context, target *corev1.PersistentVolumeClaim) error {
	k.uploadOutcomesOf().forget(target.UID)
	ns := k.PrimeNamespace(target)
	owned := client.MatchingLabels{cdiv1.LabelOwnedByUID: string(target.UID)}
	retain := target.DeletionTimestamp == nil && populators.RetainWorkers(target, ns)
	lists := []client.ObjectList{&corev1.PersistentVolumeClaimList{}}
	if !retain {
		lists = append(lists, &corev1.PodList{})
	}
	if k.Snapshots {
		lists = append(lists, &snapshotv1.VolumeSnapshotList{})
	}
	for _, list := range lists {
		if err := k.Client.List(ctx, list, client.InNamespace(ns), owned); err != nil {
			return fmt.Errorf("listing the temporary objects of %s/%s: %w", target.Namespace, target.Name, err)
		}
		var objs []client.Object
		switch l := list.(type) {
		case *corev1.PersistentVolumeClaimList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		case *corev1.PodList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		case *snapshotv1.VolumeSnapshotList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		}
		for _, obj := range objs {
			if obj.GetNamespace() == target.Namespace && obj.GetName() == target.Name {
				continue
			}
			if err := k.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("deleting %T %s/%s: %w", obj, ns, obj.GetName(), err)
			}
		}
	}
	upload := cdiv1.UploadPodName(TmpClaimName(target.UID))
	named := []client.Object{
		&corev1.Secret{}, // the source pod's client certificate
		&corev1.Secret{}, // the upload pod's serving certificate
		&corev1.Service{},
	}
	for i, name := range []string{SourcePodName(target.UID), upload, upload} {
		named[i].SetNamespace(ns)
		named[i].SetName(name)
		if err := k.Client.Delete(ctx, named[i]); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting %T %s/%s: %w", named[i], ns, name, err)
		}
	}
	return nil
}

// Watches implements populators.Watcher: the temporary VolumeSnapshots
// bring their target back when they become ready; a clone's source claim
// or VolumeSnapshot, its VolumeCloneSource, and the pods that use the
// source claim bring back the targets waiting for them (a source created
// late, bound, ready, or no longer in use) at once instead of at their
// next requeue. An upload server reporting that its clone succeeded brings
// its target back too (uploadOutcomes).
func (k *Kind) Watches(b *builder.Builder) *builder.Builder {
	b = b.WatchesRawSource(source.Func(k.uploadOutcomesOf().start))
	b = b.Watches(&corev1.PersistentVolumeClaim{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []ctrl.Request {
		return k.sourceTargets(ctx, obj, "PersistentVolumeClaim")
	})).Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []ctrl.Request {
		// A pod that held a source writable (CloneSourceInUse) stopping.
		var reqs []ctrl.Request
		for _, claim := range ClaimsOf(obj) {
			reqs = append(reqs, k.sourceTargets(ctx, claim, "PersistentVolumeClaim")...)
		}
		return reqs
	})).Watches(&cdiv1.VolumeCloneSource{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []ctrl.Request {
		vcs, ok := obj.(*cdiv1.VolumeCloneSource)
		if !ok {
			return nil
		}
		return k.cloneSourceTargets(ctx, vcs)
	}))
	if !k.Snapshots {
		return b
	}
	return b.Watches(&snapshotv1.VolumeSnapshot{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []ctrl.Request {
		if reqs := populators.TargetRequests(obj); len(reqs) > 0 {
			return reqs // a temporary snapshot
		}
		return k.sourceTargets(ctx, obj, "VolumeSnapshot")
	}))
}

// sourceTargets maps a claim or VolumeSnapshot to the targets of the
// VolumeCloneSources of its namespace that name it as their source (kind).
// The lists are the manager's cache.
func (k *Kind) sourceTargets(ctx context.Context, obj client.Object, kind string) []ctrl.Request {
	list := &cdiv1.VolumeCloneSourceList{}
	if err := k.Client.List(ctx, list, client.InNamespace(obj.GetNamespace())); err != nil {
		log.FromContext(ctx).Error(err, "listing VolumeCloneSources to find the clones of a source", "namespace", obj.GetNamespace())
		return nil
	}
	var reqs []ctrl.Request
	for i := range list.Items {
		if NamesSource(&list.Items[i], kind, obj.GetName()) {
			reqs = append(reqs, k.cloneSourceTargets(ctx, &list.Items[i])...)
		}
	}
	return reqs
}

// ClaimsOf are the claims a pod mounts, as bare objects naming them. Pure.
func ClaimsOf(obj client.Object) []client.Object {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil
	}
	var claims []client.Object
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			claims = append(claims, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: v.PersistentVolumeClaim.ClaimName}})
		}
	}
	return claims
}

// NamesSource reports whether vcs clones the kind (PersistentVolumeClaim,
// VolumeSnapshot) named name, in its own namespace. Pure.
func NamesSource(vcs *cdiv1.VolumeCloneSource, kind, name string) bool {
	src := vcs.Spec.Source
	srcKind := src.Kind
	if srcKind == "" {
		srcKind = "PersistentVolumeClaim"
	}
	return srcKind == kind && src.Name == name
}

// cloneSourceTargets are the claims whose dataSourceRef names vcs. A
// DataVolume's VolumeCloneSource names its DataVolume, whose claim has its
// name; any other is looked for among the cached claims.
func (k *Kind) cloneSourceTargets(ctx context.Context, vcs *cdiv1.VolumeCloneSource) []ctrl.Request {
	if key, ok := DataVolumeOf(vcs); ok {
		return []ctrl.Request{{NamespacedName: key}}
	}
	claims := &corev1.PersistentVolumeClaimList{}
	if err := k.Client.List(ctx, claims); err != nil {
		log.FromContext(ctx).Error(err, "listing claims to find the clones of a VolumeCloneSource", "namespace", vcs.Namespace, "name", vcs.Name)
		return nil
	}
	var reqs []ctrl.Request
	for i := range claims.Items {
		pvc := &claims.Items[i]
		if populators.Handles(pvc, cdiv1.VolumeCloneSourceRef) && pvc.Spec.DataSourceRef.Name == vcs.Name && populators.SourceNamespace(pvc) == vcs.Namespace {
			reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pvc)})
		}
	}
	return reqs
}

// DataVolumeOf names the DataVolume a VolumeCloneSource was made for (its
// claim has the same name): its controller in the same namespace, or
// cdi.kubevirt.io/ownedByDataVolume across namespaces. Pure.
func DataVolumeOf(vcs *cdiv1.VolumeCloneSource) (types.NamespacedName, bool) {
	if ref := vcs.Annotations[cdiv1.AnnOwnedByDataVolume]; ref != "" {
		if ns, name, ok := strings.Cut(ref, "/"); ok && ns != "" && name != "" {
			return types.NamespacedName{Namespace: ns, Name: name}, true
		}
	}
	if owner := metav1.GetControllerOf(vcs); owner != nil && owner.Kind == "DataVolume" {
		return types.NamespacedName{Namespace: vcs.Namespace, Name: owner.Name}, true
	}
	return types.NamespacedName{}, false
}

// PhaseAnnotations implements populators.PhaseReporter: the clone's phase
// (cdi.kubevirt.io/clonePhase) and, where no wait or worker explains it,
// CDI's running condition for that phase.
func (k *Kind) PhaseAnnotations(target *corev1.PersistentVolumeClaim, phase string, res populators.Result) map[string]string {
	p := PhaseName(phase)
	switch {
	case res.Done:
		p = PhaseSucceeded
	case res.Reason == reasonCloneError:
		p = PhaseError
	}
	if _, known := dataVolumePhases[p]; !known && p != PhaseError {
		return nil
	}
	ann := map[string]string{cdiv1.AnnClonePhase: string(p)}
	if p == PhaseError || (res.Reason == "" && res.Pod == nil) || res.Done {
		if r, ok := RunningFor(string(p), target.Annotations[cdiv1.AnnCloneError], nil); ok {
			if p == PhaseError {
				r.Message = res.Message
			}
			ann[cdiv1.AnnRunningCondition], ann[cdiv1.AnnRunningConditionMessage], ann[cdiv1.AnnRunningConditionReason] = r.Status, r.Message, r.Reason
		}
	}
	return ann
}

// named gives a base phase a clone phase's name.
type named struct {
	populators.Phase
	name PhaseName
}

func (n *named) Name() string { return string(n.name) }
