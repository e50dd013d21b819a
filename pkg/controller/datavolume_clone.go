package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/clone"
	"github.com/kubefill/kubefill/pkg/cloneauth"
	"github.com/kubefill/kubefill/pkg/token"
)

// cloneRetry is how often a clone waiting for something outside its own
// objects (a source, a DataSource) looks again.
const cloneRetry = 5 * time.Second

// Running condition reasons of a clone DataVolume that waits or is refused.
const (
	reasonCloneTokenInvalid = "CloneTokenInvalid"
	reasonNoTokenKeys       = "CloneTokenKeysMissing"
	reasonDataSourceMissing = "DataSourceNotFound"
	reasonDataSourceNotRdy  = "DataSourceNotReady"
	reasonCloneSourceNotRdy = "CloneSourceNotReady"
	// reasonCloneTokenNotMinted: the controller could not sign the
	// extended clone token (its key Secret is missing or unreadable).
	reasonCloneTokenNotMinted = "CloneTokenNotMinted"
	// reasonWaitForFirstConsumer: the claim's class binds on first consumer
	// and no pod uses the claim yet.
	reasonWaitForFirstConsumer = "WaitForFirstConsumer"
	// reasonSourceNotAuthorized: the sourceRef now resolves to a source
	// the user the clone token names may not clone (the populator's word
	// for a refused source too).
	reasonSourceNotAuthorized = "SourceNotAuthorized"
	// reasonCloneReauthorized: the sourceRef now resolves to another
	// source, which that user may clone.
	reasonCloneReauthorized = "CloneSourceReauthorized"
)

// notAuthorizedRetry is how often a clone refused for its new source asks
// again (a RoleBinding may be added; nothing watches RBAC).
const notAuthorizedRetry = 30 * time.Second

// withConsumerWait says in a clone's view why it has not started when its
// claim waits for a first consumer: the populator does not start before a
// pod using the claim is scheduled, and nothing else would tell the user.
// A view that already explains itself, or a clone the populator has
// begun, is left alone. Pure.
func withConsumerWait(view ClaimView) ClaimView {
	pvc := view.Claim
	if pvc == nil || !view.WaitsForConsumer || view.Problem != "" || pvc.Annotations[cdiv1.AnnClonePhase] != "" ||
		pvc.Annotations[cdiv1.AnnRunningConditionReason] != "" {
		return view
	}
	view.ProblemReason = reasonWaitForFirstConsumer
	view.Problem = fmt.Sprintf("PVC %s waits for its first consumer: StorageClass %s binds a volume only once a pod using the claim is scheduled "+
		"(volumeBindingMode WaitForFirstConsumer), and the clone starts then; start the VM or a pod that uses PVC %s, "+
		"or clone into a StorageClass with Immediate binding", pvc.Name, ptr.Deref(pvc.Spec.StorageClassName, ""), pvc.Name)
	return view
}

// tokenNotMinted is the wait of a clone whose extended token the
// controller cannot sign: not a silent retry, the user (or the admin) is
// told where the key lives. Pure but for the event.
func (r *DataVolumeReconciler) tokenNotMinted(dv *cdiv1.DataVolume, src CloneSource, what string, err error) ClaimView {
	msg := fmt.Sprintf("cannot sign the %s (%v): the controller signs it with the key in Secret %s of its install namespace; "+
		"make sure the controller can read (or create) that Secret; the clone goes on by itself once it can", what, err, DefaultExtendedTokenKeySecret)
	return r.wait(dv, corev1.EventTypeWarning, reasonCloneTokenNotMinted, msg, &src)
}

// wait is a ClaimView for a clone that cannot go on yet: Running says why,
// an event says it once, and the DataVolume is looked at again soon.
func (r *DataVolumeReconciler) wait(dv *cdiv1.DataVolume, eventType, reason, msg string, src *CloneSource) ClaimView {
	return r.waitFor(dv, eventType, reason, msg, src, cloneRetry)
}

// waitFor is wait, looking again after retry.
func (r *DataVolumeReconciler) waitFor(dv *cdiv1.DataVolume, eventType, reason, msg string, src *CloneSource, retry time.Duration) ClaimView {
	for _, c := range dv.Status.Conditions {
		if c.Type == cdiv1.DataVolumeRunning && c.Reason == reason && c.Message == msg {
			return ClaimView{Problem: msg, ProblemReason: reason, RetryAfter: retry, CloneSource: src}
		}
	}
	r.event(dv, eventType, reason, "Clone", msg)
	return ClaimView{Problem: msg, ProblemReason: reason, RetryAfter: retry, CloneSource: src}
}

// resolveCloneSource is the DataVolume's source, following a sourceRef to
// its DataSource (and from there at most one DataSource further, as CDI).
// When it cannot be known yet, src is nil and view says why.
func (r *DataVolumeReconciler) resolveCloneSource(ctx context.Context, dv *cdiv1.DataVolume) (*CloneSource, ClaimView, error) {
	if s := DirectCloneSource(dv); s != nil {
		return s, ClaimView{}, nil
	}
	ref := dv.Spec.SourceRef
	ns := ptr.Deref(ref.Namespace, "")
	if ns == "" {
		ns = dv.Namespace
	}
	name := ref.Name
	for depth := 0; ; depth++ {
		ds := &cdiv1.DataSource{}
		if err := r.reader().Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, ds); err != nil {
			if apierrors.IsNotFound(err) {
				msg := fmt.Sprintf("DataSource %s/%s named by spec.sourceRef doesn't exist; the DataVolume waits until it is created", ns, name)
				return nil, r.wait(dv, corev1.EventTypeWarning, reasonDataSourceMissing, msg, nil), nil
			}
			return nil, ClaimView{}, fmt.Errorf("reading DataSource %s/%s: %w", ns, name, err)
		}
		if msg := DataSourceNotReady(ds); msg != "" {
			return nil, r.wait(dv, corev1.EventTypeNormal, reasonDataSourceNotRdy, msg, nil), nil
		}
		next := ds.Spec.Source.DataSource
		if next == nil {
			if s := cloneSourceOf(ds.Spec.Source.PVC, ds.Spec.Source.Snapshot, ds.Namespace); s != nil {
				return s, ClaimView{}, nil
			}
			msg := fmt.Sprintf("DataSource %s/%s names no pvc or snapshot source", ns, name)
			return nil, r.wait(dv, corev1.EventTypeWarning, reasonDataSourceNotRdy, msg, nil), nil
		}
		if depth == 1 {
			msg := fmt.Sprintf("DataSource %s/%s points to another DataSource more than one level deep", ns, name)
			return nil, r.wait(dv, corev1.EventTypeWarning, reasonDataSourceNotRdy, msg, nil), nil
		}
		if next.Namespace != "" {
			ns = next.Namespace
		}
		name = next.Name
	}
}

// authorizeClone makes sure the DataVolume's extended token, bound to its
// UID, covers src, the source resolved now, before anything else is done
// for the clone: the short token lasts minutes, the source may come much
// later (CDI issue #2777). required (a clone from another namespace) says a
// token is needed at all; a clone within the DataVolume's namespace needs
// none, but one that carries a valid token is held to it, so that a
// sourceRef re-pointed within the namespace is authorised too.
//
// When src is not the source the token names (a sourceRef DataSource
// re-pointed after admission), the clone's SubjectAccessReviews run again,
// for the user the token records, against src: allowed, a new extended
// token naming src is minted (and a Normal event says so); refused, the
// clone waits with a Running condition and a Warning event naming the
// missing permission. A DataVolume never clones a source nobody authorised
// for it. stop says to return: the DataVolume was annotated (the update
// brings it back), or view says why the clone waits.
func (r *DataVolumeReconciler) authorizeClone(ctx context.Context, dv *cdiv1.DataVolume, src CloneSource, required bool) (view ClaimView, stop bool, err error) {
	if _, err := r.dataVolumeTokenPayload(dv, src); err == nil {
		return ClaimView{}, false, nil
	}
	if r.CloneTokens == nil || r.ExtendedTokens == nil {
		if !required {
			return ClaimView{}, false, nil
		}
		return r.noKeys(dv, src), true, nil
	}
	grant, err := r.grantOf(dv)
	if err != nil {
		if !required {
			return ClaimView{}, false, nil
		}
		msg := fmt.Sprintf("the clone token is invalid or expired: %v; delete and re-create the DataVolume", err)
		return r.wait(dv, corev1.EventTypeWarning, reasonCloneTokenInvalid, msg, &src), true, nil
	}
	p, err := grantCovers(grant, dv, src)
	if err != nil {
		if dv.Spec.SourceRef == nil {
			// A direct source never moves (the spec is immutable): a
			// token for another source is not this DataVolume's.
			msg := fmt.Sprintf("the clone token is invalid or expired: %v; delete and re-create the DataVolume", err)
			return r.wait(dv, corev1.EventTypeWarning, reasonCloneTokenInvalid, msg, &src), true, nil
		}
		var view *ClaimView
		if p, view, err = r.reauthorize(ctx, dv, src, grant); p == nil || err != nil {
			return ptr.Deref(view, ClaimView{}), true, err
		}
	}
	ext, err := r.ExtendedTokens.Generate(token.WithUID(p, string(dv.UID)))
	if err != nil {
		if !required {
			// Authorised; within one namespace the clone needs no token
			// of its own, so a key the controller cannot read does not
			// hold it up as it did not before.
			return ClaimView{}, false, nil
		}
		return r.tokenNotMinted(dv, src, "DataVolume's extended clone token", err), true, nil
	}
	patch := client.MergeFrom(dv.DeepCopy())
	if dv.Annotations == nil {
		dv.Annotations = map[string]string{}
	}
	dv.Annotations[cdiv1.AnnExtendedCloneToken] = ext
	if err := r.Client.Patch(ctx, dv, patch); err != nil {
		return ClaimView{}, true, fmt.Errorf("annotating the DataVolume with its extended clone token: %w", err)
	}
	return ClaimView{CloneSource: &src}, true, nil
}

// reauthorize runs the clone's SubjectAccessReviews for the user grant
// records against src, which the DataVolume's sourceRef resolves to now
// instead of the source grant names. Allowed, it returns the payload of a
// token for src (for that user); otherwise view says why the clone waits.
func (r *DataVolumeReconciler) reauthorize(ctx context.Context, dv *cdiv1.DataVolume, src CloneSource, grant *token.Payload) (*token.Payload, *ClaimView, error) {
	moved := fmt.Sprintf("%s now resolves to %s %s/%s, not to %s, which the DataVolume's clone token was issued for",
		describeSourceRef(dv), src.kind(), src.Namespace, src.Name, describeTokenSource(grant))
	if grant.Requester == nil || grant.Requester.Username == "" {
		msg := moved + "; the token records no user to authorise again (it was issued by an older Kubefill); delete and re-create the DataVolume"
		view := r.waitFor(dv, corev1.EventTypeWarning, reasonSourceNotAuthorized, msg, &src, notAuthorizedRetry)
		return nil, &view, nil
	}
	authz := r.Authorizer
	if authz == nil {
		authz = cloneauth.Authorizer{Client: r.Client}
	}
	ok, reason, err := authz.Authorize(ctx, grant.Requester.UserInfo(), cloneauth.Source{Resource: src.Resource(), Namespace: src.Namespace, Name: src.Name})
	if err != nil {
		return nil, nil, fmt.Errorf("authorising %q again for %s %s/%s: %w", grant.Requester.Username, src.kind(), src.Namespace, src.Name, err)
	}
	if !ok {
		msg := moved + "; " + reason + "; the DataVolume waits until that is granted or the DataSource points back"
		view := r.waitFor(dv, corev1.EventTypeWarning, reasonSourceNotAuthorized, msg, &src, notAuthorizedRetry)
		return nil, &view, nil
	}
	r.event(dv, corev1.EventTypeNormal, reasonCloneReauthorized, "Clone",
		fmt.Sprintf("%s; user %q may clone it, so the clone goes on from it", moved, grant.Requester.Username))
	return token.WithRequester(token.NewClonePayload(src.Resource(), src.Namespace, src.Name, dv.Namespace, dv.Name), grant.Requester), nil, nil
}

func (r *DataVolumeReconciler) noKeys(dv *cdiv1.DataVolume, src CloneSource) ClaimView {
	msg := fmt.Sprintf("the controller has no token keys to check the clone token of this clone from namespace %s; "+
		"start kubefill controller with the signing key Secret mounted", src.Namespace)
	return r.wait(dv, corev1.EventTypeWarning, reasonNoTokenKeys, msg, &src)
}

// ensureSourceRefToken mints the extended token at once for a DataVolume
// with a sourceRef and a valid short token: what the webhook authorised
// (the source resolved at admission, or the DataSource's namespace when it
// named none yet) and for whom outlives the short token's minutes, so a
// golden image imported much later (CDI #2777) or a DataSource re-pointed
// after admission is still decided against it. stop says the DataVolume
// was annotated. Any problem with the token is left for authorizeClone to
// report, once the DataSource resolves.
func (r *DataVolumeReconciler) ensureSourceRefToken(ctx context.Context, dv *cdiv1.DataVolume) (stop bool, err error) {
	short := dv.Annotations[cdiv1.AnnCloneToken]
	if dv.Spec.SourceRef == nil || short == "" || dv.Annotations[cdiv1.AnnExtendedCloneToken] != "" || r.CloneTokens == nil || r.ExtendedTokens == nil {
		return false, nil
	}
	p, err := r.CloneTokens.Validate(short)
	if err != nil || checkTokenTarget(p, dv, false) != nil {
		return false, nil
	}
	ext, err := r.ExtendedTokens.Generate(token.WithUID(p, string(dv.UID)))
	if err != nil {
		return false, nil
	}
	patch := client.MergeFrom(dv.DeepCopy())
	dv.Annotations[cdiv1.AnnExtendedCloneToken] = ext
	if err := r.Client.Patch(ctx, dv, patch); err != nil {
		return true, fmt.Errorf("annotating the DataVolume with its extended clone token: %w", err)
	}
	return true, nil
}

// grantOf is what the DataVolume's clone tokens authorise, whichever
// source it resolves to now: its extended token when valid and bound to
// it, else its short token when valid and issued for it.
func (r *DataVolumeReconciler) grantOf(dv *cdiv1.DataVolume) (*token.Payload, error) {
	var extErr error
	if t := dv.Annotations[cdiv1.AnnExtendedCloneToken]; t != "" && r.ExtendedTokenValidator != nil {
		p, err := r.ExtendedTokenValidator.Validate(t)
		if err == nil {
			err = checkTokenTarget(p, dv, true)
		}
		if err == nil {
			return p, nil
		}
		extErr = fmt.Errorf("the extended clone token: %w", err)
	}
	t := dv.Annotations[cdiv1.AnnCloneToken]
	if t == "" {
		if extErr != nil {
			return nil, extErr
		}
		return nil, fmt.Errorf("the DataVolume has no %s (the mutating webhook adds it at creation)", cdiv1.AnnCloneToken)
	}
	p, err := r.CloneTokens.Validate(t)
	if err == nil {
		err = checkTokenTarget(p, dv, false)
	}
	if err != nil {
		return nil, errors.Join(extErr, err)
	}
	return p, nil
}

// checkTokenTarget says whether p is a clone token issued for dv: its
// namespace and name and, when bound, its UID. Pure.
func checkTokenTarget(p *token.Payload, dv *cdiv1.DataVolume, bound bool) error {
	if p.Operation != token.OperationClone {
		return fmt.Errorf("%w: operation is %q, want %q", token.ErrPayloadMismatch, p.Operation, token.OperationClone)
	}
	if ns, name := p.Params[token.ParamTargetNamespace], p.Params[token.ParamTargetName]; ns != dv.Namespace || name != dv.Name {
		return fmt.Errorf("%w: issued for %s/%s, not this DataVolume %s/%s", token.ErrPayloadMismatch, ns, name, dv.Namespace, dv.Name)
	}
	if bound {
		return token.CheckUID(p, string(dv.UID))
	}
	return nil
}

// grantCovers returns the payload of a token for a clone of src into dv
// when grant, a token issued for dv, allows it: grant itself, or for a
// token that names dv's sourceRef DataSource (it had no source at
// admission), one naming src, if src lies in the DataSource's namespace.
// Pure.
func grantCovers(grant *token.Payload, dv *cdiv1.DataVolume, src CloneSource) (*token.Payload, error) {
	if grant.Resource == token.ResourceDataSource {
		return dataSourceTokenFor(grant, dv, src)
	}
	if err := token.CheckClone(grant, src.Resource(), src.Namespace, src.Name, dv.Namespace, dv.Name); err != nil {
		return nil, err
	}
	return grant, nil
}

// describeSourceRef names the DataVolume's sourceRef DataSource. Pure.
func describeSourceRef(dv *cdiv1.DataVolume) string {
	ref := dv.Spec.SourceRef
	if ref == nil {
		return "the DataVolume's source"
	}
	return fmt.Sprintf("DataSource %s/%s (spec.sourceRef)", ptr.Deref(ref.Namespace, dv.Namespace), ref.Name)
}

// describeTokenSource names the source a clone token was issued for. Pure.
func describeTokenSource(p *token.Payload) string {
	switch p.Resource.Resource {
	case token.ResourceDataSource.Resource:
		return fmt.Sprintf("any source in namespace %s (DataSource %s named none when the DataVolume was created)", p.Namespace, p.Name)
	case token.ResourceVolumeSnapshot.Resource:
		return fmt.Sprintf("VolumeSnapshot %s/%s", p.Namespace, p.Name)
	}
	return fmt.Sprintf("PersistentVolumeClaim %s/%s", p.Namespace, p.Name)
}

// dataSourceTokenFor checks a token the webhook issued for dv's sourceRef
// DataSource when it did not exist yet or named no source (a golden image
// before its first import): the user was authorised for the DataSource's
// namespace. It holds for src, now resolved, only if src lies in that
// namespace; the payload returned names src (for the same requester), so
// the extended token minted from it reads as any other. Pure.
func dataSourceTokenFor(p *token.Payload, dv *cdiv1.DataVolume, src CloneSource) (*token.Payload, error) {
	ref := dv.Spec.SourceRef
	if ref == nil || ref.Kind != cdiv1.DataVolumeDataSource {
		return nil, errors.New("the clone token names a DataSource, but the DataVolume has no sourceRef to one")
	}
	refNS := ptr.Deref(ref.Namespace, "")
	if refNS == "" {
		refNS = dv.Namespace
	}
	if err := token.CheckClone(p, token.ResourceDataSource, refNS, ref.Name, dv.Namespace, dv.Name); err != nil {
		return nil, err
	}
	if src.Namespace != refNS {
		return nil, fmt.Errorf("the clone token allows cloning from namespace %s (DataSource %s named no source when the DataVolume was created), "+
			"but the DataSource now resolves to %s %s in namespace %s", refNS, ref.Name, src.word(), src.Name, src.Namespace)
	}
	return token.WithRequester(token.NewClonePayload(src.Resource(), src.Namespace, src.Name, dv.Namespace, dv.Name), p.Requester), nil
}

// dataVolumeTokenPayload validates the DataVolume's extended token: issued
// for this clone and bound to the DataVolume's UID.
func (r *DataVolumeReconciler) dataVolumeTokenPayload(dv *cdiv1.DataVolume, src CloneSource) (*token.Payload, error) {
	t := dv.Annotations[cdiv1.AnnExtendedCloneToken]
	if t == "" || r.ExtendedTokenValidator == nil {
		return nil, errors.New("no extended clone token, or no key to check it")
	}
	p, err := r.ExtendedTokenValidator.Validate(t)
	if err != nil {
		return nil, err
	}
	if p.Resource == token.ResourceDataSource {
		if err := token.CheckUID(p, string(dv.UID)); err != nil {
			return nil, err
		}
		return dataSourceTokenFor(p, dv, src)
	}
	if err := token.CheckExtendedClone(p, src.Resource(), src.Namespace, src.Name, dv.Namespace, dv.Name, string(dv.UID)); err != nil {
		return nil, err
	}
	return p, nil
}

// claimToken is the extended token for the claim: the DataVolume's, re-bound
// to the claim's UID.
func (r *DataVolumeReconciler) claimToken(dv *cdiv1.DataVolume, src CloneSource, claimUID types.UID) (string, error) {
	if r.ExtendedTokens == nil {
		return "", errors.New("no key to sign extended clone tokens")
	}
	p, err := r.dataVolumeTokenPayload(dv, src)
	if err != nil {
		return "", fmt.Errorf("the DataVolume's extended clone token: %w", err)
	}
	return r.ExtendedTokens.Generate(token.WithUID(p, string(claimUID)))
}

// cloneSize reads the source and what the size rules need of it. When it
// cannot be read, ok is false and view says why.
func (r *DataVolumeReconciler) cloneSize(ctx context.Context, dv *cdiv1.DataVolume, src CloneSource) (size CloneSize, view ClaimView, ok bool, err error) {
	missing := func() ClaimView {
		return r.wait(dv, corev1.EventTypeWarning, EventCloneWithoutSource, fmt.Sprintf("The source %s %s doesn't exist", src.word(), src.Name), &src)
	}
	key := types.NamespacedName{Namespace: src.Namespace, Name: src.Name}
	if !src.Snapshot {
		pvc := &corev1.PersistentVolumeClaim{}
		if err := r.Client.Get(ctx, key, pvc); err != nil {
			if apierrors.IsNotFound(err) {
				return size, missing(), false, nil
			}
			return size, ClaimView{}, false, fmt.Errorf("reading the source claim %s: %w", key, err)
		}
		if c, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
			size.Size = &c
		}
		if q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
			size.Minimum = &q
		} else {
			size.Minimum = size.Size
		}
		size.Mode = pvc.Spec.VolumeMode
		if size.Mode == nil {
			size.Mode = ptr.To(corev1.PersistentVolumeFilesystem)
		}
		return size, ClaimView{}, true, nil
	}
	snap := &snapshotv1.VolumeSnapshot{}
	if err := r.reader().Get(ctx, key, snap); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return size, missing(), false, nil
		case meta.IsNoMatchError(err):
			msg := fmt.Sprintf("cannot clone from snapshot %s: the VolumeSnapshot API (snapshot.storage.k8s.io/v1) is not installed in this cluster", key)
			return size, r.wait(dv, corev1.EventTypeWarning, reasonCloneSourceNotRdy, msg, &src), false, nil
		}
		return size, ClaimView{}, false, fmt.Errorf("reading the source snapshot %s: %w", key, err)
	}
	if st := snap.Status; st != nil && st.Error != nil && st.Error.Message != nil {
		msg := fmt.Sprintf("snapshot %s in error state with msg: %s", key, *st.Error.Message)
		return size, r.wait(dv, corev1.EventTypeWarning, EventCloneValidationFailed, msg, &src), false, nil
	}
	if st := snap.Status; st != nil && st.RestoreSize != nil {
		rs := st.RestoreSize.DeepCopy()
		size.Size = &rs
		if !rs.IsZero() {
			size.Minimum = &rs
		}
	}
	if m, ok := snap.Annotations[cdiv1.AnnSnapshotSourceVolumeMode]; ok {
		size.Mode = ptr.To(corev1.PersistentVolumeMode(m))
	}
	if st := snap.Status; st != nil && st.BoundVolumeSnapshotContentName != nil {
		content := &snapshotv1.VolumeSnapshotContent{}
		if err := r.reader().Get(ctx, types.NamespacedName{Name: *st.BoundVolumeSnapshotContentName}, content); err == nil && content.Spec.SourceVolumeMode != nil {
			size.Mode = content.Spec.SourceVolumeMode
		}
	}
	return size, ClaimView{}, true, nil
}

// reconcileCloneClaim makes a clone DataVolume's VolumeCloneSource, in the
// source's namespace, and its claim, when the claim does not exist yet.
func (r *DataVolumeReconciler) reconcileCloneClaim(ctx context.Context, dv *cdiv1.DataVolume, kind *sourceKind) (ClaimView, error) {
	if stop, err := r.ensureSourceRefToken(ctx, dv); stop || err != nil {
		return ClaimView{}, err
	}
	src, view, err := r.resolveCloneSource(ctx, dv)
	if src == nil || err != nil {
		return view, err
	}
	crossNS := src.Namespace != dv.Namespace
	if crossNS || dv.Spec.SourceRef != nil {
		if view, stop, err := r.authorizeClone(ctx, dv, *src, crossNS); stop || err != nil {
			return view, err
		}
	}
	if err := r.inheritInstancetypeLabels(ctx, dv, *src); err != nil {
		return ClaimView{}, err
	}
	size, view, ok, err := r.cloneSize(ctx, dv, *src)
	if !ok || err != nil {
		return view, err
	}
	spec, className, err := r.renderClaimWith(ctx, dv, func(dv *cdiv1.DataVolume, profile *cdiv1.StorageProfile, class string, overhead float64) (*corev1.PersistentVolumeClaimSpec, error) {
		return RenderCloneClaimSpec(dv, profile, class, overhead, size)
	})
	var refusal *cloneRefusal
	switch {
	case errors.Is(err, errSizeUnknown):
		msg := fmt.Sprintf("the source %s %s/%s does not report its size yet (a claim's status.capacity once Bound, a snapshot's status.restoreSize); "+
			"the DataVolume names no size, so it waits for the source's", src.word(), src.Namespace, src.Name)
		return r.wait(dv, corev1.EventTypeNormal, reasonCloneSourceNotRdy, msg, src), nil
	case errors.As(err, &refusal):
		msg := fmt.Sprintf("%s: %s", clone.MessageCloneValidationFailed, refusal.msg)
		return r.wait(dv, corev1.EventTypeWarning, EventCloneValidationFailed, msg, src), nil
	case err != nil:
		r.event(dv, corev1.EventTypeWarning, "ErrClaimNotValid", "RenderClaim", err.Error())
		return ClaimView{Problem: err.Error(), ProblemReason: "ErrClaimNotValid", CloneSource: src}, nil
	}
	if crossNS && !controllerutil.ContainsFinalizer(dv, cdiv1.FinalizerDataVolume) {
		patch := client.MergeFrom(dv.DeepCopy())
		controllerutil.AddFinalizer(dv, cdiv1.FinalizerDataVolume)
		if err := r.Client.Patch(ctx, dv, patch); err != nil {
			return ClaimView{}, fmt.Errorf("adding the DataVolume finalizer: %w", err)
		}
	}
	if err := r.ensureCloneSource(ctx, dv, kind, *src); err != nil {
		return ClaimView{}, err
	}
	pvc, view, err := r.createClaim(ctx, dv, kind, spec, CloneClaimAnnotations(dv, *src), className)
	if pvc == nil || err != nil {
		view.CloneSource = src
		return view, err
	}
	if crossNS {
		if view, err := r.annotateClaimToken(ctx, dv, *src, pvc); view != nil || err != nil {
			// The next reconcile tries again; the populator waits meanwhile.
			return ptr.Deref(view, ClaimView{}), err
		}
	}
	view, err = r.viewOf(ctx, pvc)
	view.CloneSource = src
	return withConsumerWait(view), err
}

// ensureCloneSource writes the VolumeCloneSource in the source's
// namespace: owned by the DataVolume in its own, else naming it in an
// annotation (its finalizer deletes it).
func (r *DataVolumeReconciler) ensureCloneSource(ctx context.Context, dv *cdiv1.DataVolume, kind *sourceKind, src CloneSource) error {
	vcs := &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Name: kind.sourceName(dv), Namespace: src.Namespace}}
	// No claim uses it yet: one made for a source the DataSource no longer
	// names (the claim could not be made, then the DataSource moved) is
	// made again, since its spec cannot change.
	old := &cdiv1.VolumeCloneSource{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(vcs), old); err == nil && !equality.Semantic.DeepEqual(old.Spec, CloneSourceSpecFor(dv, src)) {
		if err := r.Client.Delete(ctx, old, client.Preconditions{UID: &old.UID}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting VolumeCloneSource %s/%s made for another source: %w", src.Namespace, vcs.Name, err)
		}
		return fmt.Errorf("VolumeCloneSource %s/%s named %s %s, made before the DataSource changed; deleted, it is made again", src.Namespace, vcs.Name, old.Spec.Source.Kind, old.Spec.Source.Name)
	}
	_, err := controllerutil.CreateOrUpdate(ctx, r.Client, vcs, func() error {
		vcs.Spec = CloneSourceSpecFor(dv, src)
		if src.Namespace == dv.Namespace {
			return controllerutil.SetControllerReference(dv, vcs, r.Client.Scheme())
		}
		if vcs.Annotations == nil {
			vcs.Annotations = map[string]string{}
		}
		vcs.Annotations[cdiv1.AnnOwnedByDataVolume] = dv.Namespace + "/" + dv.Name
		return nil
	})
	if err != nil {
		return fmt.Errorf("writing VolumeCloneSource %s/%s: %w", src.Namespace, vcs.Name, err)
	}
	return nil
}

// annotateClaimToken puts the extended token bound to the claim's UID on
// it. A token it cannot sign is a wait, in view.
func (r *DataVolumeReconciler) annotateClaimToken(ctx context.Context, dv *cdiv1.DataVolume, src CloneSource, pvc *corev1.PersistentVolumeClaim) (*ClaimView, error) {
	t, err := r.claimToken(dv, src, pvc.UID)
	if err != nil {
		view := r.tokenNotMinted(dv, src, "claim's extended clone token", err)
		view.Claim = pvc
		return &view, nil
	}
	patch := client.MergeFrom(pvc.DeepCopy())
	if pvc.Annotations == nil {
		pvc.Annotations = map[string]string{}
	}
	pvc.Annotations[cdiv1.AnnExtendedCloneToken] = t
	if err := r.Client.Patch(ctx, pvc, patch); err != nil {
		return nil, fmt.Errorf("annotating claim %s with its extended clone token: %w", pvc.Name, err)
	}
	return nil, nil
}

// syncCloneClaim keeps a clone DataVolume and its existing claim in step:
// the claim's extended token, the clone type copied to the DataVolume, and
// once the clone succeeded, the cross-namespace VolumeCloneSource removed.
// A non-nil view is a wait that replaces the claim's own.
//
// Once the claim exists the clone's source is the one its VolumeCloneSource
// names, fixed when the claim was made (its spec is immutable): a
// DataSource re-pointed afterwards does not move a clone already under
// way, and the claim's token and the DataVolume's messages name that
// source, not the DataSource's new one.
func (r *DataVolumeReconciler) syncCloneClaim(ctx context.Context, dv *cdiv1.DataVolume, pvc *corev1.PersistentVolumeClaim) (*CloneSource, *ClaimView, error) {
	src, err := r.pinnedCloneSource(ctx, dv, pvc)
	if err != nil {
		return nil, nil, err
	}
	if src == nil {
		if src, _, err = r.resolveCloneSourceQuietly(ctx, dv); err != nil {
			return nil, nil, err
		}
	}
	srcNS := pvc.Annotations[cdiv1.AnnDataSourceNamespace]
	if src != nil && srcNS != "" && srcNS != dv.Namespace && pvc.Annotations[cdiv1.AnnExtendedCloneToken] == "" && !claimDone(pvc) {
		if view, err := r.annotateClaimToken(ctx, dv, *src, pvc); view != nil || err != nil {
			return src, view, err
		}
	}
	if ct, ok := pvc.Annotations[cdiv1.AnnCloneType]; ok && dv.Annotations[cdiv1.AnnCloneType] != ct {
		patch := client.MergeFrom(dv.DeepCopy())
		if dv.Annotations == nil {
			dv.Annotations = map[string]string{}
		}
		dv.Annotations[cdiv1.AnnCloneType] = ct
		if err := r.Client.Patch(ctx, dv, patch); err != nil {
			return src, nil, fmt.Errorf("copying %s to the DataVolume: %w", cdiv1.AnnCloneType, err)
		}
	}
	if claimDone(pvc) && controllerutil.ContainsFinalizer(dv, cdiv1.FinalizerDataVolume) {
		return src, nil, r.releaseCloneSource(ctx, dv)
	}
	return src, nil, nil
}

// pinnedCloneSource is the source the DataVolume's VolumeCloneSource
// names, for the claim pvc made with it; nil when there is none (the clone
// is over and it was removed).
func (r *DataVolumeReconciler) pinnedCloneSource(ctx context.Context, dv *cdiv1.DataVolume, pvc *corev1.PersistentVolumeClaim) (*CloneSource, error) {
	ns := dv.Namespace
	if s := pvc.Annotations[cdiv1.AnnDataSourceNamespace]; s != "" {
		ns = s
	}
	vcs := &cdiv1.VolumeCloneSource{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: CloneSourceName(dv)}, vcs); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading the clone's VolumeCloneSource %s/%s: %w", ns, CloneSourceName(dv), err)
	}
	if !metav1.IsControlledBy(vcs, dv) && vcs.Annotations[cdiv1.AnnOwnedByDataVolume] != dv.Namespace+"/"+dv.Name {
		return nil, nil
	}
	ref := vcs.Spec.Source
	switch ref.Kind {
	case "PersistentVolumeClaim":
		return &CloneSource{Namespace: ns, Name: ref.Name}, nil
	case "VolumeSnapshot":
		return &CloneSource{Snapshot: true, Namespace: ns, Name: ref.Name}, nil
	}
	return nil, nil
}

// cloneClaimView is what the status shows of a clone DataVolume's existing
// claim: kept in step (syncCloneClaim), and saying so when it waits for its
// first consumer.
func (r *DataVolumeReconciler) cloneClaimView(ctx context.Context, dv *cdiv1.DataVolume, pvc *corev1.PersistentVolumeClaim) (ClaimView, error) {
	src, wait, err := r.syncCloneClaim(ctx, dv, pvc)
	if err != nil {
		return ClaimView{}, err
	}
	if wait != nil {
		return *wait, nil
	}
	view, err := r.viewOf(ctx, pvc)
	view.CloneSource = src
	return withConsumerWait(view), err
}

// resolveCloneSourceQuietly resolves the source for messages, without
// events or waits: nil when it cannot be known.
func (r *DataVolumeReconciler) resolveCloneSourceQuietly(ctx context.Context, dv *cdiv1.DataVolume) (*CloneSource, ClaimView, error) {
	if s := DirectCloneSource(dv); s != nil {
		return s, ClaimView{}, nil
	}
	quiet := *r
	quiet.Recorder = nil
	return quiet.resolveCloneSource(ctx, dv)
}

// claimDone: the clone into the claim is over and the claim bound.
func claimDone(pvc *corev1.PersistentVolumeClaim) bool {
	return pvc.Status.Phase == corev1.ClaimBound &&
		(pvc.Annotations[cdiv1.AnnClonePhase] == string(clone.PhaseSucceeded) || pvc.Annotations[cdiv1.AnnPopulatedFor] == pvc.Name)
}

// releaseCloneSource deletes the DataVolume's VolumeCloneSource in another
// namespace, wherever it is, then drops the DataVolume's finalizer.
func (r *DataVolumeReconciler) releaseCloneSource(ctx context.Context, dv *cdiv1.DataVolume) error {
	list := &cdiv1.VolumeCloneSourceList{}
	if err := r.Client.List(ctx, list); err != nil {
		return fmt.Errorf("listing VolumeCloneSources: %w", err)
	}
	owner := dv.Namespace + "/" + dv.Name
	for i := range list.Items {
		vcs := &list.Items[i]
		if vcs.Name != CloneSourceName(dv) || vcs.Annotations[cdiv1.AnnOwnedByDataVolume] != owner {
			continue
		}
		if err := r.Client.Delete(ctx, vcs); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting VolumeCloneSource %s/%s: %w", vcs.Namespace, vcs.Name, err)
		}
	}
	patch := client.MergeFrom(dv.DeepCopy())
	controllerutil.RemoveFinalizer(dv, cdiv1.FinalizerDataVolume)
	if err := r.Client.Patch(ctx, dv, patch); err != nil {
		return fmt.Errorf("removing the DataVolume finalizer: %w", err)
	}
	return nil
}

// cloneSourceKeys name what a clone DataVolume waits for, "<kind>/<ns>/<name>"
// of its source claim, VolumeSnapshot or DataSource. Pure.
func cloneSourceKeys(dv *cdiv1.DataVolume) []string {
	if s := DirectCloneSource(dv); s != nil {
		kind := "PersistentVolumeClaim"
		if s.Snapshot {
			kind = "VolumeSnapshot"
		}
		return []string{sourceKey(kind, s.Namespace, s.Name)}
	}
	if ref := dv.Spec.SourceRef; ref != nil && ref.Kind == cdiv1.DataVolumeDataSource {
		return []string{sourceKey(cdiv1.DataVolumeDataSource, ptr.Deref(ref.Namespace, dv.Namespace), ref.Name)}
	}
	return nil
}

func sourceKey(kind, ns, name string) string { return kind + "/" + ns + "/" + name }

// sourceChanged passes what a waiting clone DataVolume cares about in a
// claim or VolumeSnapshot: its creation, and an update that changes its
// status (bound, a capacity, ready), not the many annotation updates.
var sourceChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool { return statusChanged(e.ObjectOld, e.ObjectNew) },
	DeleteFunc: func(event.DeleteEvent) bool { return false },
}

// statusChanged reports whether a claim's or a VolumeSnapshot's status
// differs between old and new. Pure.
func statusChanged(old, new client.Object) bool {
	switch o := old.(type) {
	case *corev1.PersistentVolumeClaim:
		n, ok := new.(*corev1.PersistentVolumeClaim)
		return !ok || !equality.Semantic.DeepEqual(o.Status, n.Status)
	case *snapshotv1.VolumeSnapshot:
		n, ok := new.(*snapshotv1.VolumeSnapshot)
		return !ok || !equality.Semantic.DeepEqual(o.Status, n.Status)
	}
	return true
}

// dataSourceNames reports whether ds names the claim or VolumeSnapshot
// (kind) ns/name as its source. Pure.
func dataSourceNames(ds *cdiv1.DataSource, kind, ns, name string) bool {
	s := cloneSourceOf(ds.Spec.Source.PVC, ds.Spec.Source.Snapshot, ds.Namespace)
	return s != nil && s.Snapshot == (kind == "VolumeSnapshot") && s.Namespace == ns && s.Name == name
}

// watchCloneSources makes a clone DataVolume waiting for its source claim,
// VolumeSnapshot or DataSource go on as soon as that appears or changes,
// rather than at its next requeue: events on those map back to the
// unfinished DataVolumes that name them, found by a scan of the cached
// DataVolumes (with a field index instead, a manager that may not list
// DataVolumes did not stop when cancelled). Only a claim or snapshot that
// appears or changes phase is mapped, not every update. A claim or
// snapshot behind a DataSource maps through the DataSources of its
// namespace.
func (r *DataVolumeReconciler) watchCloneSources(mgr ctrl.Manager, b *builder.Builder) (*builder.Builder, error) {
	c := mgr.GetClient()
	waiting := func(ctx context.Context, kind string, obj client.Object) []ctrl.Request {
		keys := []string{sourceKey(kind, obj.GetNamespace(), obj.GetName())}
		if kind != cdiv1.DataVolumeDataSource {
			sources := &cdiv1.DataSourceList{}
			if err := c.List(ctx, sources, client.InNamespace(obj.GetNamespace())); err != nil {
				log.FromContext(ctx).Error(err, "listing DataSources to find the clones of a source", "namespace", obj.GetNamespace())
			}
			for i := range sources.Items {
				if dataSourceNames(&sources.Items[i], kind, obj.GetNamespace(), obj.GetName()) {
					keys = append(keys, sourceKey(cdiv1.DataVolumeDataSource, sources.Items[i].Namespace, sources.Items[i].Name))
				}
			}
		}
		dvs := &cdiv1.DataVolumeList{}
		if err := c.List(ctx, dvs, client.UnsafeDisableDeepCopy); err != nil {
			log.FromContext(ctx).Error(err, "listing the DataVolumes to find the clones of a source")
			return nil
		}
		var reqs []ctrl.Request
		for i := range dvs.Items {
			if dv := &dvs.Items[i]; dv.Status.Phase != cdiv1.Succeeded && slices.ContainsFunc(cloneSourceKeys(dv), func(k string) bool { return slices.Contains(keys, k) }) {
				reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(dv)})
			}
		}
		return reqs
	}
	mapTo := func(kind string) handler.EventHandler {
		return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []ctrl.Request {
			return waiting(ctx, kind, obj)
		})
	}
	b = b.Watches(&corev1.PersistentVolumeClaim{}, mapTo("PersistentVolumeClaim"), builder.WithPredicates(sourceChanged)).
		Watches(&cdiv1.DataSource{}, mapTo(cdiv1.DataVolumeDataSource))
	snapshots, err := kindServed(mgr, volumeSnapshotGVK)
	if err != nil {
		return nil, err
	}
	if snapshots {
		b = b.Watches(&snapshotv1.VolumeSnapshot{}, mapTo("VolumeSnapshot"), builder.WithPredicates(sourceChanged))
	}
	return b, nil
}
