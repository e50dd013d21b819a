package controller

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// CDIObservation is what the CDI reconciler saw, from which the status follows.
type CDIObservation struct {
	// Version is this build's version: operatorVersion, targetVersion and,
	// once deployed, observedVersion.
	Version string
	// Unwanted says another CDI resource claimed the install (it controls
	// ConfigMap cdi-config): this one goes to Error.
	Unwanted bool
	// NotReady names the install's Deployments that are not ready, each
	// with its replica counts.
	NotReady []string
}

// NextCDIStatus computes a CDI resource's status from its current one and
// what was observed, step by step as CDI's operator (the controller
// lifecycle operator SDK) does:
//   - an unwanted resource is marked failed: Available=False,
//     Progressing=False, Degraded=True (ConfigError), phase Error; Error is
//     final, as in CDI (delete the resource);
//   - a new resource starts Deploying: Available=False, Progressing=True
//     (DeployStarted), Degraded=False, with operator and target versions;
//   - a changed version starts Upgrading: True/True/True (UpgradeStarted);
//   - while any Deployment is not ready the phase does not move on, and a
//     Deployed resource reports Degraded=True;
//   - once all are ready it is Deployed: True/False/False (DeployCompleted),
//     observedVersion set.
//
// Conditions are only touched (and their heartbeat moved to now) when their
// status, reason or message changes, so a steady state writes nothing.
func NextCDIStatus(cur cdiv1.CDIStatus, obs CDIObservation, now metav1.Time) cdiv1.CDIStatus {
	st := *cur.DeepCopy()
	set := func(typ string, status corev1.ConditionStatus, reason, message string) {
		setOperatorCondition(&st.Conditions, cdiv1.OperatorCondition{Type: typ, Status: status, Reason: reason, Message: message}, now)
	}
	mark := func(available, progressing, degraded corev1.ConditionStatus, on, reason, message string) {
		for _, c := range []struct {
			typ    string
			status corev1.ConditionStatus
		}{{cdiv1.CDIConditionAvailable, available}, {cdiv1.CDIConditionProgressing, progressing}, {cdiv1.CDIConditionDegraded, degraded}} {
			if c.typ == on {
				set(c.typ, c.status, reason, message)
			} else {
				set(c.typ, c.status, "", "")
			}
		}
	}
	if st.Phase == cdiv1.CDIPhaseError {
		return st
	}
	if obs.Unwanted {
		mark(corev1.ConditionFalse, corev1.ConditionFalse, corev1.ConditionTrue, cdiv1.CDIConditionDegraded, cdiv1.CDIReasonConfigError, cdiv1.CDIMessageUnwanted)
		st.Phase = cdiv1.CDIPhaseError
		return st
	}
	if st.Phase == cdiv1.CDIPhaseEmpty {
		mark(corev1.ConditionFalse, corev1.ConditionTrue, corev1.ConditionFalse, cdiv1.CDIConditionProgressing, cdiv1.CDIReasonDeployStarted, cdiv1.CDIMessageDeployStarted)
		st.OperatorVersion, st.TargetVersion = obs.Version, obs.Version
		st.Phase = cdiv1.CDIPhaseDeploying
	}
	if st.OperatorVersion != obs.Version {
		st.OperatorVersion, st.TargetVersion = obs.Version, obs.Version
	}
	if cdiUpgrading(st) && st.Phase != cdiv1.CDIPhaseUpgrading {
		mark(corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionTrue, cdiv1.CDIConditionDegraded, cdiv1.CDIReasonUpgradeStarted, fmt.Sprintf(cdiv1.CDIMessageUpgradeStarted, obs.Version))
		st.Phase = cdiv1.CDIPhaseUpgrading
	}
	degraded := len(obs.NotReady) > 0
	if degraded && st.Phase == cdiv1.CDIPhaseDeployed {
		set(cdiv1.CDIConditionDegraded, corev1.ConditionTrue, "", "not ready: "+strings.Join(obs.NotReady, ", "))
	} else if st.Phase != cdiv1.CDIPhaseUpgrading || !degraded {
		set(cdiv1.CDIConditionDegraded, corev1.ConditionFalse, "", "")
	}
	if !degraded && (st.Phase != cdiv1.CDIPhaseDeployed || cdiUpgrading(st)) {
		st.ObservedVersion = obs.Version
		mark(corev1.ConditionTrue, corev1.ConditionFalse, corev1.ConditionFalse, cdiv1.CDIConditionAvailable, cdiv1.CDIReasonDeployCompleted, cdiv1.CDIMessageDeployCompleted)
		st.Phase = cdiv1.CDIPhaseDeployed
	}
	return st
}

// cdiUpgrading is the SDK's IsUpgrading: a deployed version differs from the target.
func cdiUpgrading(st cdiv1.CDIStatus) bool {
	deploying := st.Phase == cdiv1.CDIPhaseDeploying
	return (st.ObservedVersion != "" || !deploying) && st.ObservedVersion != st.TargetVersion
}

// setOperatorCondition sets one condition: a new one gets both times; a
// changed status moves lastTransitionTime; any change moves lastHeartbeatTime.
func setOperatorCondition(conds *[]cdiv1.OperatorCondition, c cdiv1.OperatorCondition, now metav1.Time) {
	for i := range *conds {
		cur := &(*conds)[i]
		if cur.Type != c.Type {
			continue
		}
		if cur.Status == c.Status && cur.Reason == c.Reason && cur.Message == c.Message {
			return
		}
		if cur.Status != c.Status {
			cur.LastTransitionTime = now
		}
		cur.Status, cur.Reason, cur.Message, cur.LastHeartbeatTime = c.Status, c.Reason, c.Message, now
		return
	}
	c.LastTransitionTime, c.LastHeartbeatTime = now, now
	*conds = append(*conds, c)
}

// CDIConditionTrue says whether the named condition is True.
func CDIConditionTrue(st cdiv1.CDIStatus, typ string) bool {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// DeploymentReady is the SDK's readiness of an operand Deployment: as many
// replicas as desired (1 when unset), all of them ready.
func DeploymentReady(d *appsv1.Deployment) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	return want == d.Status.Replicas && d.Status.Replicas == d.Status.ReadyReplicas
}

// SeedCDIConfig decides the first configAuthority step, as CDI's operator:
// a CDI resource without spec.config takes the spec of the one existing
// CDIConfig, unless it is empty. It returns the spec.config to set, or nil
// to leave it as it is.
func SeedCDIConfig(cdi *cdiv1.CDI, configs []cdiv1.CDIConfig) *cdiv1.CDIConfigSpec {
	if cdi.Spec.Config != nil || len(configs) != 1 {
		return nil
	}
	spec := configs[0].Spec.DeepCopy()
	if reflect.DeepEqual(spec, &cdiv1.CDIConfigSpec{}) {
		return nil
	}
	return spec
}

// InstallComponentSelector selects the install's own Deployments (the operands).
var InstallComponentSelector = client.MatchingLabels{cdiv1.LabelAppName: "kubefill"}

// CDIReconciler reports the installation's health on the CDI resource, the
// way CDI's operator does, for KubeVirt and the hyperconverged operator: one
// CDI resource is honoured (the first, which claims ConfigMap cdi-config in
// the install namespace), its phase, conditions and versions follow the
// install namespace's Deployments, and it becomes the CDIConfig's authority
// (cdi.kubevirt.io/configAuthority). It installs nothing, the manifests do,
// but it places the install's Deployments as the honoured resource's
// spec.infra, priorityClass and imagePullPolicy ask (PlaceDeployment).
type CDIReconciler struct {
	Client client.Client
	// Reader reads the claim ConfigMap uncached (ConfigMaps are not cached).
	Reader client.Reader
	// Recorder, when set, receives the transitions as events on the CDI resource.
	Recorder events.EventRecorder
	// Namespace is the install namespace.
	Namespace string
	// Version is this build's version.
	Version string
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// SetupWithManager registers the reconciler: CDI resources, and the install
// namespace's Deployments (a change reconciles every CDI resource).
func (r *CDIReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Namespace == "" {
		return fmt.Errorf("the CDI controller needs the install namespace")
	}
	allCDIs := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var list cdiv1.CDIList
		if err := r.Client.List(ctx, &list); err != nil {
			log.FromContext(ctx).Error(err, "listing CDI resources for a Deployment change")
			return nil
		}
		out := make([]reconcile.Request, 0, len(list.Items))
		for i := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
		}
		return out
	})
	inInstall := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetNamespace() == r.Namespace })
	err := ctrl.NewControllerManagedBy(mgr).
		Named("cdi").
		For(&cdiv1.CDI{}).
		Watches(&appsv1.Deployment{}, allCDIs, builder.WithPredicates(inInstall)).
		Complete(r)
	if err != nil {
		return fmt.Errorf("building the CDI controller: %w", err)
	}
	return nil
}

func (r *CDIReconciler) now() metav1.Time {
	if r.Now != nil {
		return metav1.NewTime(r.Now())
	}
	return metav1.Now()
}

// Reconcile reads the CDI resource, the claim and the Deployments, decides
// the status with NextCDIStatus and writes what changed.
func (r *CDIReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx).WithValues("cdi", req.Name)
	cr := &cdiv1.CDI{}
	if err := r.Client.Get(ctx, req.NamespacedName, cr); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if cr.DeletionTimestamp != nil {
		return reconcile.Result{}, r.finish(ctx, cr)
	}

	honoured, wait, err := r.claim(ctx, cr)
	if err != nil {
		return reconcile.Result{}, err
	}
	if wait {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	if honoured && cr.Status.Phase != cdiv1.CDIPhaseError {
		if done, err := r.prepare(ctx, cr); err != nil || done {
			return reconcile.Result{}, err
		}
		if err := r.placeInfra(ctx, r.infraWant(ctx, cr)); err != nil {
			if apierrors.IsConflict(err) {
				return reconcile.Result{RequeueAfter: conflictRetry}, nil
			}
			return reconcile.Result{}, err
		}
	}

	obs := CDIObservation{Version: r.Version, Unwanted: !honoured}
	if honoured {
		var deps appsv1.DeploymentList
		if err := r.Client.List(ctx, &deps, client.InNamespace(r.Namespace), InstallComponentSelector); err != nil {
			return reconcile.Result{}, fmt.Errorf("listing the Deployments of install namespace %s: %w", r.Namespace, err)
		}
		for i := range deps.Items {
			if d := &deps.Items[i]; !DeploymentReady(d) {
				obs.NotReady = append(obs.NotReady, fmt.Sprintf("Deployment %s (%d/%d ready)", d.Name, d.Status.ReadyReplicas, ptrInt32(d.Spec.Replicas, 1)))
			}
		}
		sort.Strings(obs.NotReady)
	}
	next := NextCDIStatus(cr.Status, obs, r.now())
	if !equality.Semantic.DeepEqual(next, cr.Status) {
		before := cr.Status
		cr.Status = next
		if err := r.Client.Status().Update(ctx, cr); err != nil {
			if apierrors.IsConflict(err) {
				return reconcile.Result{RequeueAfter: conflictRetry}, nil
			}
			return reconcile.Result{}, fmt.Errorf("updating CDI %s status: %w", cr.Name, err)
		}
		logger.Info("CDI status", "phase", next.Phase, "notReady", obs.NotReady)
		r.events(cr, before, next)
	}
	if honoured {
		setCRReady(next)
	}
	return reconcile.Result{}, nil
}

// claim makes sure cdi-config in the install namespace names a CDI
// resource as controller: this one if none does (creating the ConfigMap if
// needed), or it says this one is unwanted. A claim held by a CDI resource
// being deleted, or gone, is released first (wait).
func (r *CDIReconciler) claim(ctx context.Context, cr *cdiv1.CDI) (honoured, wait bool, err error) {
	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: r.Namespace, Name: cdiv1.CDIOperatorConfigMap}
	err = r.Reader.Get(ctx, key, cm)
	switch {
	case apierrors.IsNotFound(err):
		if cr.Status.Phase == cdiv1.CDIPhaseError {
			return false, false, nil
		}
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: cdiv1.CDIOperatorConfigMap,
			Labels: map[string]string{cdiv1.LabelCDIOperator: "", cdiv1.LabelAppName: "kubefill", cdiv1.LabelAppManagedBy: "kubefill"}}}
		if err := controllerutil.SetControllerReference(cr, cm, r.Client.Scheme()); err != nil {
			return false, false, fmt.Errorf("owning ConfigMap %s by CDI %s: %w", key, cr.Name, err)
		}
		if err := r.Client.Create(ctx, cm); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return false, true, nil
			}
			return false, false, fmt.Errorf("claiming the install for CDI %s (creating ConfigMap %s): %w", cr.Name, key, err)
		}
		return true, false, nil
	case err != nil:
		return false, false, fmt.Errorf("reading ConfigMap %s: %w", key, err)
	}
	if metav1.IsControlledBy(cm, cr) {
		return true, false, nil
	}
	owner := metav1.GetControllerOf(cm)
	if owner != nil && owner.Kind == "CDI" {
		other := &cdiv1.CDI{}
		err := r.Client.Get(ctx, types.NamespacedName{Name: owner.Name}, other)
		if err == nil && other.UID == owner.UID && other.DeletionTimestamp == nil {
			return false, false, nil
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return false, false, fmt.Errorf("reading CDI %s, which owns ConfigMap %s: %w", owner.Name, key, err)
		}
		if cr.Status.Phase == cdiv1.CDIPhaseError {
			return false, false, nil
		}
		// The owner is gone or going: release its claim, then claim anew.
		if err := r.Client.Delete(ctx, cm, client.Preconditions{UID: &cm.UID}); err != nil && !apierrors.IsNotFound(err) {
			return false, false, fmt.Errorf("releasing ConfigMap %s of deleted CDI %s: %w", key, owner.Name, err)
		}
		return false, true, nil
	}
	if cr.Status.Phase == cdiv1.CDIPhaseError {
		return false, false, nil
	}
	// Nobody's claim (made by hand, or by another tool): take it.
	if err := controllerutil.SetControllerReference(cr, cm, r.Client.Scheme()); err != nil {
		return false, false, fmt.Errorf("owning ConfigMap %s by CDI %s: %w", key, cr.Name, err)
	}
	if err := r.Client.Update(ctx, cm); err != nil {
		if apierrors.IsConflict(err) {
			return false, true, nil
		}
		return false, false, fmt.Errorf("claiming ConfigMap %s for CDI %s: %w", key, cr.Name, err)
	}
	return true, false, nil
}

// prepare adds the finalizer and, on first reconcile, the configAuthority
// annotation (seeding spec.config from an existing CDIConfig). It says done
// when it updated the resource: the update triggers the next reconcile.
func (r *CDIReconciler) prepare(ctx context.Context, cr *cdiv1.CDI) (bool, error) {
	changed := false
	if !slices.Contains(cr.Finalizers, cdiv1.FinalizerCDIOperator) {
		cr.Finalizers = append(cr.Finalizers, cdiv1.FinalizerCDIOperator)
		changed = true
	}
	if _, ok := cr.Annotations[cdiv1.AnnConfigAuthority]; !ok {
		var configs cdiv1.CDIConfigList
		if err := r.Client.List(ctx, &configs); err != nil {
			return false, fmt.Errorf("listing CDIConfigs to seed CDI %s spec.config: %w", cr.Name, err)
		}
		if seed := SeedCDIConfig(cr, configs.Items); seed != nil {
			cr.Spec.Config = seed
		}
		if cr.Annotations == nil {
			cr.Annotations = map[string]string{}
		}
		cr.Annotations[cdiv1.AnnConfigAuthority] = ""
		changed = true
	}
	if !changed {
		return false, nil
	}
	if err := r.Client.Update(ctx, cr); err != nil {
		if apierrors.IsConflict(err) {
			return true, nil
		}
		return false, fmt.Errorf("adding the finalizer and %s to CDI %s: %w", cdiv1.AnnConfigAuthority, cr.Name, err)
	}
	return true, nil
}

// finish handles a CDI resource being deleted: the install's Deployments
// get the manifests' placement back if it was the honoured one, the phase
// goes to Deleting, then Deleted, and the finalizer goes. The install stays (the manifests own it);
// its claim ConfigMap goes with its owner.
func (r *CDIReconciler) finish(ctx context.Context, cr *cdiv1.CDI) error {
	if !slices.Contains(cr.Finalizers, cdiv1.FinalizerCDIOperator) {
		return nil
	}
	cm := &corev1.ConfigMap{}
	err := r.Reader.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: cdiv1.CDIOperatorConfigMap}, cm)
	if client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("reading ConfigMap %s/%s: %w", r.Namespace, cdiv1.CDIOperatorConfigMap, err)
	}
	if err == nil && metav1.IsControlledBy(cm, cr) {
		// The honoured resource goes: the Deployments get the manifests' values back.
		if err := r.placeInfra(ctx, InfraWant{}); err != nil {
			return err
		}
	}
	for _, phase := range []cdiv1.CDIPhase{cdiv1.CDIPhaseDeleting, cdiv1.CDIPhaseDeleted} {
		if cr.Status.Phase == phase {
			continue
		}
		cr.Status.Phase = phase
		if err := r.Client.Status().Update(ctx, cr); err != nil {
			return client.IgnoreNotFound(fmt.Errorf("setting CDI %s phase %s: %w", cr.Name, phase, err))
		}
	}
	cr.Finalizers = slices.DeleteFunc(cr.Finalizers, func(f string) bool { return f == cdiv1.FinalizerCDIOperator })
	if err := r.Client.Update(ctx, cr); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing finalizer %s from CDI %s: %w", cdiv1.FinalizerCDIOperator, cr.Name, err)
	}
	return nil
}

// events records the transitions CDI's operator reports as events.
func (r *CDIReconciler) events(cr *cdiv1.CDI, before, after cdiv1.CDIStatus) {
	if r.Recorder == nil || before.Phase == after.Phase {
		return
	}
	switch after.Phase {
	case cdiv1.CDIPhaseDeploying:
		r.Recorder.Eventf(cr, nil, corev1.EventTypeNormal, cdiv1.CDIReasonDeployStarted, "Deploy", cdiv1.CDIMessageDeployStarted)
	case cdiv1.CDIPhaseDeployed:
		r.Recorder.Eventf(cr, nil, corev1.EventTypeNormal, cdiv1.CDIReasonDeployCompleted, "Deploy", cdiv1.CDIMessageDeployCompleted)
	case cdiv1.CDIPhaseUpgrading:
		r.Recorder.Eventf(cr, nil, corev1.EventTypeNormal, cdiv1.CDIReasonUpgradeStarted, "Upgrade", cdiv1.CDIMessageUpgradeStarted, after.TargetVersion)
	case cdiv1.CDIPhaseError:
		r.Recorder.Eventf(cr, nil, corev1.EventTypeWarning, cdiv1.CDIReasonConfigError, "Reconcile", cdiv1.CDIMessageUnwanted)
	}
}

func ptrInt32(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// installCache limits the manager's cache of Deployments to the install
// namespace, the only ones the CDI controller reads (none without one).
func installCache(installNS string) cache.Options {
	ns := installNS
	if ns == "" {
		ns = "kubefill-no-install-namespace"
	}
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&appsv1.Deployment{}: {Namespaces: map[string]cache.Config{ns: {}}},
	}}
}

// versionOr is the version reported when none was stamped into the build.
func versionOr(v string) string {
	if v == "" {
		return "v0.0.0-dev"
	}
	return v
}
