package controller

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/cloneauth"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/pkg/storage"
	"github.com/kubefill/kubefill/pkg/token"
)

// DataVolumeReconciler renders each DataVolume's claim, points it at a
// populator source, and reports the population's progress on the DataVolume.
type DataVolumeReconciler struct {
	Client   client.Client
	Recorder recorder.EventRecorder

	// CloneTokens validates the short clone token (issuer cdi-apiserver) that
	// the mutating webhook puts on a cross-namespace clone DataVolume. Nil:
	// cross-namespace clones wait with a condition saying there are no keys;
	// same-namespace clones need no token.
	CloneTokens token.Validator
	// ExtendedTokens mints the long-lived extended clone token (issuer
	// cdi-deployment, lifetime token.DefaultExtendedCloneTokenLifetime) bound
	// to the DataVolume's and then the claim's UID.
	ExtendedTokens token.Generator
	// ExtendedTokenValidator validates extended clone tokens (issuer cdi-deployment).
	ExtendedTokenValidator token.Validator
	// Authorizer runs a clone's SubjectAccessReviews again, for the user
	// its clone token records, when its sourceRef comes to resolve to
	// another source than the token names; nil uses
	// cloneauth.Authorizer{Client}.
	Authorizer interface {
		Authorize(ctx context.Context, user authenticationv1.UserInfo, src cloneauth.Source) (bool, string, error)
	}
	// Reader reads what a clone only looks at, DataSources, VolumeSnapshots
	// and their contents, without a cache (and so without list and watch
	// permissions on them); SetupWithManager makes it the manager's API
	// reader when nil, and Client is used when it stays nil.
	Reader client.Reader
}

// reader is Reader, or Client when there is none.
func (r *DataVolumeReconciler) reader() client.Reader {
	if r.Reader != nil {
		return r.Reader
	}
	return r.Client
}

var volumeSnapshotGVK = snapshotv1.SchemeGroupVersion.WithKind("VolumeSnapshot")

// SetupWithManager registers the reconciler, following the claims and the
// populator sources of every kind it owns.
func (r *DataVolumeReconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named("datavolume").
		For(&cdiv1.DataVolume{}).
		Owns(&corev1.PersistentVolumeClaim{})
	for _, kind := range sourceKinds {
		b = b.Owns(kind.newSource())
	}
	if r.Reader == nil {
		r.Reader = mgr.GetAPIReader()
	}
	// A clone of a VolumeSnapshot reads it; the API may not be installed,
	// which the clone reports when it reads it.
	if !mgr.GetScheme().Recognizes(volumeSnapshotGVK) {
		if err := snapshotv1.AddToScheme(mgr.GetScheme()); err != nil {
			return fmt.Errorf("adding snapshot.storage.k8s.io/v1 to the scheme: %w", err)
		}
	}
	b, err := r.watchCloneSources(mgr, b)
	if err != nil {
		return err
	}
	return b.Complete(r)
}

// Reconcile brings one DataVolume's claim and status up to date.
func (r *DataVolumeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := r.reconcile(ctx, req)
	if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		// The namespace and the DataVolume in it are going away: not a failure.
		return ctrl.Result{}, nil
	}
	return res, err
}

func (r *DataVolumeReconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	dv := &cdiv1.DataVolume{}
	if err := r.Client.Get(ctx, req.NamespacedName, dv); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if dv.DeletionTimestamp != nil {
		if controllerutil.ContainsFinalizer(dv, cdiv1.FinalizerDataVolume) {
			// A cross-namespace clone: its VolumeCloneSource is out of the
			// garbage collector's reach.
			return ctrl.Result{}, r.releaseCloneSource(ctx, dv)
		}
		return ctrl.Result{}, nil
	}
	view, err := r.reconcileClaim(ctx, dv)
	if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: view.RetryAfter}, r.updateStatus(ctx, dv, view)
}

// reconcileClaim makes sure the DataVolume's import source and claim exist,
// and returns what the status computation needs to know about the claim.
func (r *DataVolumeReconciler) reconcileClaim(ctx context.Context, dv *cdiv1.DataVolume) (ClaimView, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(dv), pvc)
	if err != nil && !apierrors.IsNotFound(err) {
		return ClaimView{}, fmt.Errorf("reading claim %s: %w", dv.Name, err)
	}
	kind := kindOf(dv)
	if err == nil {
		if metav1.IsControlledBy(pvc, dv) {
			if pvc.Annotations[cdiv1.AnnPrePopulated] == dv.Name {
				// Adopted already filled: nothing is imported or cloned into it.
				return r.viewOf(ctx, pvc)
			}
			if kind != nil && kind.clone {
				return r.cloneClaimView(ctx, dv, pvc)
			}
			return r.viewOf(ctx, pvc)
		}
		return r.adopt(ctx, dv, pvc)
	}
	if cdiv1.DataVolumePrePopulated(dv) {
		// As in CDI, the claim comes from elsewhere (a restore): wait for it.
		return ClaimView{}, nil
	}

	if kind == nil {
		msg := fmt.Sprintf("DataVolumes with source %s are not supported by Kubefill yet: imports (http, s3, registry, blank), upload and clones (pvc, snapshot, a DataSource) are", describeSource(dv))
		r.event(dv, corev1.EventTypeWarning, "UnsupportedSource", "RenderClaim", msg)
		return ClaimView{Problem: msg, ProblemReason: "UnsupportedSource"}, nil
	}
	if kind.clone {
		return r.reconcileCloneClaim(ctx, dv, kind)
	}
	if err := r.ensureSource(ctx, dv, kind); err != nil {
		return ClaimView{}, err
	}
	spec, className, err := r.renderClaim(ctx, dv)
	if err != nil {
		r.event(dv, corev1.EventTypeWarning, "ErrClaimNotValid", "RenderClaim", err.Error())
		return ClaimView{Problem: err.Error(), ProblemReason: "ErrClaimNotValid"}, nil
	}
	pvc, view, err := r.createClaim(ctx, dv, kind, spec, claimAnnotations(dv), className)
	if pvc == nil || err != nil {
		return view, err
	}
	return r.viewOf(ctx, pvc)
}

// createClaim creates the DataVolume's claim from spec, its dataSourceRef
// naming the kind's source, owned by the DataVolume. A nil claim means the
// view says why there is none, or the next reconcile will see it.
func (r *DataVolumeReconciler) createClaim(ctx context.Context, dv *cdiv1.DataVolume, kind *sourceKind, spec *corev1.PersistentVolumeClaimSpec,
	annotations map[string]string, className string) (*corev1.PersistentVolumeClaim, ClaimView, error) {
	config, err := r.cdiConfig(ctx)
	if err != nil {
		return nil, ClaimView{}, err
	}
	if !cdiv1.HonorsWaitForFirstConsumer(config) && !cdiv1.ImmediateBindingRequested(&metav1.ObjectMeta{Annotations: annotations}) {
		// CDI's gate-off path: every new claim binds at once.
		annotations[cdiv1.AnnImmediateBinding] = ""
	}
	spec.DataSource = nil
	spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: kind.ref, Name: kind.sourceName(dv)}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: dv.Name, Namespace: dv.Namespace, Labels: claimLabels(dv), Annotations: annotations},
		Spec:       *spec,
	}
	if err := controllerutil.SetControllerReference(dv, pvc, r.Client.Scheme()); err != nil {
		return nil, ClaimView{}, fmt.Errorf("owning claim %s: %w", dv.Name, err)
	}
	if err := r.Client.Create(ctx, pvc); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, ClaimView{}, nil // the next reconcile sees it
		}
		msg := fmt.Sprintf("creating claim %s: %v", dv.Name, err)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota: ") {
			// CDI's reason; nothing watches quotas, so look again soon.
			r.event(dv, corev1.EventTypeWarning, populators.ReasonExceededQuota, "CreateClaim", msg)
			return nil, ClaimView{Problem: msg, ProblemReason: populators.ReasonExceededQuota, RetryAfter: populators.QuotaRetry}, nil
		}
		r.event(dv, corev1.EventTypeWarning, "ErrClaimNotValid", "CreateClaim", msg)
		return nil, ClaimView{Problem: msg, ProblemReason: "ErrClaimNotValid"}, nil
	}
	log.FromContext(ctx).Info("created claim", "claim", pvc.Name, "storageClass", className)
	r.event(dv, corev1.EventTypeNormal, "Pending", "CreateClaim", fmt.Sprintf("PVC %s created", pvc.Name))
	if dv.Annotations[cdiv1.AnnUsePopulator] != "true" {
		patch := client.MergeFrom(dv.DeepCopy())
		if dv.Annotations == nil {
			dv.Annotations = map[string]string{}
		}
		dv.Annotations[cdiv1.AnnUsePopulator] = "true"
		if err := r.Client.Patch(ctx, dv, patch); err != nil {
			return nil, ClaimView{}, fmt.Errorf("marking DataVolume as populated by a populator: %w", err)
		}
	}
	return pvc, ClaimView{}, nil
}

// adopt handles a claim of the DataVolume's name that it does not own. As in
// CDI it is taken over only when it was populated for this DataVolume (a
// restored claim) or adoption is allowed (the annotation, else the
// DataVolumeClaimAdoption gate), and never from another controller; then it
// counts as already populated, and nothing is imported or cloned into it.
func (r *DataVolumeReconciler) adopt(ctx context.Context, dv *cdiv1.DataVolume, pvc *corev1.PersistentVolumeClaim) (ClaimView, error) {
	config, err := r.cdiConfig(ctx)
	if err != nil {
		return ClaimView{}, err
	}
	if !cdiv1.ClaimMayExistBeforeDataVolume(pvc, dv, cdiv1.FeatureGateEnabled(config, cdiv1.FeatureGateDataVolumeClaimAdoption)) {
		msg := fmt.Sprintf("PVC %s already exists and is not owned by this DataVolume; annotate the DataVolume with %s=true to adopt it", pvc.Name, cdiv1.AnnAllowClaimAdoption)
		r.event(dv, corev1.EventTypeWarning, "ErrClaimExists", "AdoptClaim", msg)
		return ClaimView{Problem: msg, ProblemReason: "ErrClaimExists"}, nil
	}
	if owner := metav1.GetControllerOf(pvc); owner != nil {
		msg := fmt.Sprintf("PVC %s is controlled by %s %s and cannot be adopted", pvc.Name, owner.Kind, owner.Name)
		r.event(dv, corev1.EventTypeWarning, "ErrClaimExists", "AdoptClaim", msg)
		return ClaimView{Problem: msg, ProblemReason: "ErrClaimExists"}, nil
	}
	if pvc.DeletionTimestamp != nil {
		msg := fmt.Sprintf("PVC %s is being deleted", pvc.Name)
		return ClaimView{Problem: msg, ProblemReason: "ErrResourceMarkedForDeletion"}, nil
	}
	patch := client.MergeFrom(pvc.DeepCopy())
	if err := controllerutil.SetControllerReference(dv, pvc, r.Client.Scheme()); err != nil {
		return ClaimView{}, fmt.Errorf("owning claim %s: %w", pvc.Name, err)
	}
	if pvc.Annotations == nil {
		pvc.Annotations = map[string]string{}
	}
	pvc.Annotations[cdiv1.AnnPrePopulated] = dv.Name
	if err := r.Client.Patch(ctx, pvc, patch); err != nil {
		return ClaimView{}, fmt.Errorf("adopting claim %s: %w", pvc.Name, err)
	}
	if _, marked := dv.Annotations[cdiv1.AnnPrePopulated]; !marked && cdiv1.ClaimPopulatedFor(pvc, dv.Name) {
		// As CDI marks a DataVolume over a restored claim.
		dvPatch := client.MergeFrom(dv.DeepCopy())
		if dv.Annotations == nil {
			dv.Annotations = map[string]string{}
		}
		dv.Annotations[cdiv1.AnnPrePopulated] = pvc.Name
		if err := r.Client.Patch(ctx, dv, dvPatch); err != nil {
			return ClaimView{}, fmt.Errorf("marking DataVolume %s pre-populated: %w", dv.Name, err)
		}
	}
	r.event(dv, corev1.EventTypeNormal, "ClaimAdopted", "AdoptClaim", fmt.Sprintf("adopted existing PVC %s as already populated", pvc.Name))
	return r.viewOf(ctx, pvc)
}

// cdiConfig reads the CDIConfig singleton; nil while there is none.
func (r *DataVolumeReconciler) cdiConfig(ctx context.Context) (*cdiv1.CDIConfig, error) {
	config := &cdiv1.CDIConfig{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading CDIConfig: %w", err)
	}
	return config, nil
}

// viewOf completes a ClaimView: whether the claim waits for a consumer.
func (r *DataVolumeReconciler) viewOf(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (ClaimView, error) {
	view := ClaimView{Claim: pvc}
	if pvc.Status.Phase == corev1.ClaimBound || pvc.Spec.StorageClassName == nil {
		return view, nil
	}
	sc := &storagev1.StorageClass{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: *pvc.Spec.StorageClassName}, sc); err != nil {
		return view, client.IgnoreNotFound(err)
	}
	config, err := r.cdiConfig(ctx)
	if err != nil {
		return view, err
	}
	view.WaitsForConsumer = populators.WaitsForConsumer(pvc, sc, cdiv1.HonorsWaitForFirstConsumer(config))
	return view, nil
}

// ensureSource creates or updates the populator source of the DataVolume's
// kind, the object the claim's dataSourceRef names, owned by the DataVolume.
func (r *DataVolumeReconciler) ensureSource(ctx context.Context, dv *cdiv1.DataVolume, kind *sourceKind) error {
	src := kind.newSource()
	src.SetName(kind.sourceName(dv))
	src.SetNamespace(dv.Namespace)
	_, err := controllerutil.CreateOrUpdate(ctx, r.Client, src, func() error {
		kind.setSpec(src, dv)
		return controllerutil.SetControllerReference(dv, src, r.Client.Scheme())
	})
	if err != nil {
		return fmt.Errorf("writing %s %s: %w", kind.ref, src.GetName(), err)
	}
	return nil
}

// renderClaim resolves the StorageClass, its profile and the filesystem
// overhead, then renders the claim spec.
func (r *DataVolumeReconciler) renderClaim(ctx context.Context, dv *cdiv1.DataVolume) (*corev1.PersistentVolumeClaimSpec, string, error) {
	return r.renderClaimWith(ctx, dv, RenderClaimSpec)
}

// renderClaimWith is renderClaim with the kind's rendering function.
func (r *DataVolumeReconciler) renderClaimWith(ctx context.Context, dv *cdiv1.DataVolume,
	render func(*cdiv1.DataVolume, *cdiv1.StorageProfile, string, float64) (*corev1.PersistentVolumeClaimSpec, error)) (*corev1.PersistentVolumeClaimSpec, string, error) {
	className := ""
	if dv.Spec.PVC != nil && dv.Spec.PVC.StorageClassName != nil {
		className = *dv.Spec.PVC.StorageClassName
	} else if dv.Spec.Storage != nil && dv.Spec.Storage.StorageClassName != nil {
		className = *dv.Spec.Storage.StorageClassName
	}
	if className == "" && dv.Spec.PVC == nil {
		var err error
		if className, err = r.defaultStorageClass(ctx); err != nil {
			return nil, "", err
		}
	}
	var profile *cdiv1.StorageProfile
	if className != "" {
		p := &cdiv1.StorageProfile{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: className}, p); err == nil {
			profile = p
		} else if !apierrors.IsNotFound(err) {
			return nil, "", fmt.Errorf("reading StorageProfile %s: %w", className, err)
		}
	}
	config := &cdiv1.CDIConfig{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); client.IgnoreNotFound(err) != nil {
		return nil, "", fmt.Errorf("reading CDIConfig: %w", err)
	}
	overhead, err := strconv.ParseFloat(populators.FilesystemOverhead(config, className), 64)
	if err != nil {
		return nil, "", fmt.Errorf("filesystem overhead in CDIConfig: %w", err)
	}
	spec, err := render(dv, profile, className, overhead)
	return spec, className, err
}

// defaultStorageClass is the class of a DataVolume that names none: the
// virtualization default class if one is marked, else the cluster default,
// else "" (the claim then gets the API's default). See storage.DataVolumeClassName.
func (r *DataVolumeReconciler) defaultStorageClass(ctx context.Context) (string, error) {
	list := &storagev1.StorageClassList{}
	if err := r.Client.List(ctx, list); err != nil {
		return "", fmt.Errorf("listing StorageClasses: %w", err)
	}
	return storage.DataVolumeClassName(list.Items), nil
}

// updateStatus writes the computed status when it differs.
func (r *DataVolumeReconciler) updateStatus(ctx context.Context, dv *cdiv1.DataVolume, view ClaimView) error {
	status := ComputeStatus(dv, view)
	status.Conditions = MergeConditions(dv.Status.Conditions, status.Conditions, metav1.Now())
	if reflect.DeepEqual(status, dv.Status) {
		return nil
	}
	told := ""
	failReason, failMsg, failed := workerFailureEvent(dv.Status.Conditions, status.Conditions)
	failed = failed && view.Problem == ""
	if status.Phase != dv.Status.Phase {
		eventType := corev1.EventTypeNormal
		reason, msg := string(status.Phase), phaseMessage(dv, status)
		if view.CloneSource != nil {
			if cr, cm, ok := cloneEvent(status.Phase, dv, *view.CloneSource); ok {
				reason, msg = cr, cm
			}
		}
		if status.Phase == cdiv1.Failed || (failed && strings.Contains(msg, failMsg)) {
			// A phase entered because a worker failed (and is retried) is a warning.
			eventType = corev1.EventTypeWarning
		}
		r.event(dv, eventType, reason, "UpdatePhase", msg)
		told = msg
	}
	// The DataVolume's own problems (view.Problem) had their event where they
	// were found; a phase event may already carry the message.
	if failed && !strings.Contains(told, failMsg) {
		r.event(dv, corev1.EventTypeWarning, failReason, "UpdatePhase", failMsg)
	}
	patch := client.MergeFrom(dv.DeepCopy())
	dv.Status = status
	if err := r.Client.Status().Patch(ctx, dv, patch); err != nil {
		return fmt.Errorf("updating DataVolume status: %w", err)
	}
	return nil
}

// phaseMessage is the event text for entering a phase.
func phaseMessage(dv *cdiv1.DataVolume, st cdiv1.DataVolumeStatus) string {
	for _, c := range st.Conditions {
		if c.Type == cdiv1.DataVolumeRunning && c.Message != "" && st.Phase != cdiv1.Succeeded {
			return fmt.Sprintf("DataVolume %s is %s: %s", dv.Name, st.Phase, c.Message)
		}
	}
	return fmt.Sprintf("DataVolume %s is %s", dv.Name, st.Phase)
}

// claimLabels are the DataVolume's labels plus Kubefill's app label.
func claimLabels(dv *cdiv1.DataVolume) map[string]string {
	labels := map[string]string{cdiv1.LabelApp: cdiv1.LabelAppValue}
	for k, v := range dv.Labels {
		labels[k] = v
	}
	return labels
}

// claimAnnotations carries the DataVolume's settings that the populator and
// the worker pods read: the worker pods' networks and mesh choices among
// them, which the prime copies in turn.
func claimAnnotations(dv *cdiv1.DataVolume) map[string]string {
	ann := map[string]string{}
	for _, key := range append([]string{cdiv1.AnnImmediateBinding, cdiv1.AnnPodRetainAfterCompletion, cdiv1.AnnRequiresScratch}, populators.WorkerPodAnnotationKeys...) {
		if v, ok := dv.Annotations[key]; ok {
			ann[key] = v
		}
	}
	if kind := kindOf(dv); kind != nil && kind.immediateBinding {
		// The kind's own worker pod is the claim's first consumer: the claim
		// must not wait for another.
		ann[cdiv1.AnnImmediateBinding] = "true"
	}
	if dv.Spec.PriorityClassName != "" {
		ann[cdiv1.AnnPriorityClassName] = dv.Spec.PriorityClassName
	}
	if dv.Spec.ContentType != "" {
		ann[cdiv1.AnnContentType] = string(dv.Spec.ContentType)
	}
	return ann
}

func (r *DataVolumeReconciler) event(obj client.Object, eventType, reason, action, note string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(obj, nil, eventType, reason, action, "%s", note)
	}
}
