package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	"github.com/prometheus/client_golang/prometheus"
	cronexpr "github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/cloneauth"
	"github.com/kubefill/kubefill/pkg/populators"
)

// Event reasons of the DataImportCron controller (CDI's where CDI has one).
const (
	// ErrDataSourceAlreadyManaged: another cron manages the DataSource.
	ErrDataSourceAlreadyManaged = "ErrDataSourceAlreadyManaged"
	// ReasonPollerNotStarted: the cron's registry source cannot be polled.
	ReasonPollerNotStarted = "PollerNotStarted"
	// ReasonSnapshotClassMissing: snapshot format, but no snapshot class.
	ReasonSnapshotClassMissing = "SnapshotClassMissing"
	// ReasonNotAuthorized: the cron's ServiceAccount may not clone its source
	// (CDI's Progressing reason), also the Warning event's.
	ReasonNotAuthorized = "NotAuthorized"
)

// DefaultNotAuthorizedRetry is how soon a cron whose ServiceAccount may not
// clone its source checks again (a RoleBinding granting it is not watched).
const DefaultNotAuthorizedRetry = 30 * time.Second

// DataImportCronReconciler keeps each DataImportCron's poller (a CronJob
// and an initial Job in the install namespace running `kubefill poller`, or
// the controller's own poll for pvc sources), imports every new digest
// through a DataVolume, points the managed DataSource at the newest import,
// and removes outdated ones, as CDI's dataimportcron-controller does.
type DataImportCronReconciler struct {
	Client client.Client
	// Reader lists the poller CronJobs and Jobs uncached (default the
	// manager's API reader): only their creation is watched.
	Reader   client.Reader
	Recorder events.EventRecorder
	// Namespace is the install namespace, where the poller CronJobs run.
	Namespace string
	// Image and PullPolicy are the kubefill image the poller runs; the CDI
	// resource's spec.imagePullPolicy wins over PullPolicy.
	Image      string
	PullPolicy corev1.PullPolicy
	// ServiceAccount runs the poller (default DefaultPollerServiceAccount).
	ServiceAccount string
	// Now is the clock (default time.Now).
	Now func() time.Time
	// NotAuthorizedRetry is how soon a refused cron checks again (default
	// DefaultNotAuthorizedRetry).
	NotAuthorizedRetry time.Duration
	// PollerCopyResync is how often the copies of a poller's registry
	// Secret and CA are refreshed (default DefaultPollerCopyResync).
	PollerCopyResync time.Duration

	snapshots bool
}

// outdatedGauge is CDI's kubevirt_cdi_dataimportcron_outdated: 1 while a
// cron's newest import is not its source's current version.
var outdatedGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "kubevirt_cdi_dataimportcron_outdated",
	Help: "DataImportCron has an outdated import",
}, []string{"ns", "cron_name", "pending"})

// OutdatedGauge is the gauge, for tests that read it.
func OutdatedGauge() *prometheus.GaugeVec { return outdatedGauge }

func (r *DataImportCronReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *DataImportCronReconciler) event(obj client.Object, typ, reason, note string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(obj, nil, typ, reason, "Reconcile", note, args...)
	}
}

func cronOf(_ context.Context, obj client.Object) []reconcile.Request {
	if name := obj.GetLabels()[cdiv1.LabelDataImportCron]; name != "" {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}}}
	}
	return nil
}

func hasCronLabel(obj client.Object) bool { return obj.GetLabels()[cdiv1.LabelDataImportCron] != "" }

// SetupWithManager registers the controller and its watches: the crons, what
// they create (by label), their poller CronJobs, default-class changes and
// StorageProfile format changes.
func (r *DataImportCronReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Reader == nil {
		r.Reader = mgr.GetAPIReader()
	}
	served, err := snapshotKindServed(mgr, volumeSnapshotGVK)
	if err != nil {
		return err
	}
	r.snapshots = served
	if err := registerOutdatedGauge(); err != nil {
		return err
	}
	labelled := predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return false },
		UpdateFunc:  func(e event.UpdateEvent) bool { return hasCronLabel(e.ObjectNew) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return hasCronLabel(e.Object) },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	byLabel := handler.EnqueueRequestsFromMapFunc(cronOf)
	pollerOwner := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		l := obj.GetLabels()
		if l[cdiv1.LabelDataImportCron] == "" || l[cdiv1.LabelDataImportCronNs] == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: l[cdiv1.LabelDataImportCronNs], Name: l[cdiv1.LabelDataImportCron]}}}
	})
	c := mgr.GetClient()
	defaultClassChanged := predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		DeleteFunc: func(event.DeleteEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.GetAnnotations(), e.ObjectNew.GetAnnotations()
			return o[cdiv1.AnnDefaultStorageClass] != n[cdiv1.AnnDefaultStorageClass] || o[cdiv1.AnnDefaultVirtStorageClass] != n[cdiv1.AnnDefaultVirtStorageClass]
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	cronsWithoutClass := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		return r.cronsMatching(ctx, c, func(cron *cdiv1.DataImportCron) bool { return TemplateStorageClass(&cron.Spec.Template) == "" })
	})
	profileFormatChanged := predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return true },
		DeleteFunc: func(event.DeleteEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*cdiv1.StorageProfile), e.ObjectNew.(*cdiv1.StorageProfile)
			return !equality.Semantic.DeepEqual(o.Status.DataImportCronSourceFormat, n.Status.DataImportCronSourceFormat)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
	cronsOnProfile := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
		classes := &storagev1.StorageClassList{}
		if err := c.List(ctx, classes); err != nil {
			return nil
		}
		return r.cronsMatching(ctx, c, func(cron *cdiv1.DataImportCron) bool {
			return EffectiveStorageClass(&cron.Spec.Template, classes.Items) == obj.GetName()
		})
	})
	// The poller's pods are placed by the CDI resource and pull with
	// CDIConfig's secrets (and reach the registry as it says): a change
	// to either rewrites every cron's CronJob.
	everyCron := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		return r.cronsMatching(ctx, c, func(*cdiv1.DataImportCron) bool { return true })
	})
	workloadChanged := predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !equality.Semantic.DeepEqual(e.ObjectOld.(*cdiv1.CDI).Spec.Workloads, e.ObjectNew.(*cdiv1.CDI).Spec.Workloads)
		},
	}
	configStatusChanged := predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*cdiv1.CDIConfig), e.ObjectNew.(*cdiv1.CDIConfig)
			return !equality.Semantic.DeepEqual(o.Status.ImagePullSecrets, n.Status.ImagePullSecrets) ||
				!equality.Semantic.DeepEqual(o.Status.ImportProxy, n.Status.ImportProxy) ||
				!equality.Semantic.DeepEqual(o.Spec.InsecureRegistries, n.Spec.InsecureRegistries)
		},
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("dataimportcron").
		For(&cdiv1.DataImportCron{}).
		Watches(&cdiv1.DataVolume{}, byLabel, builder.WithPredicates(labelled)).
		Watches(&cdiv1.DataSource{}, byLabel, builder.WithPredicates(labelled)).
		// Each reconcile refreshes the claim's last use: only its phase and
		// its deletion matter here, or every touch would reconcile again.
		Watches(&corev1.PersistentVolumeClaim{}, byLabel, builder.WithPredicates(labelled, predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				return e.ObjectOld.(*corev1.PersistentVolumeClaim).Status.Phase != e.ObjectNew.(*corev1.PersistentVolumeClaim).Status.Phase
			},
		})).
		Watches(&batchv1.CronJob{}, pollerOwner, builder.WithPredicates(predicate.Funcs{
			// A CronJob seen at start whose cron is gone is cleaned up.
			CreateFunc: func(e event.CreateEvent) bool { return hasCronLabel(e.Object) },
			DeleteFunc: func(e event.DeleteEvent) bool { return hasCronLabel(e.Object) },
			UpdateFunc: func(event.UpdateEvent) bool { return false },
		})).
		Watches(&storagev1.StorageClass{}, cronsWithoutClass, builder.WithPredicates(defaultClassChanged)).
		Watches(&cdiv1.StorageProfile{}, cronsOnProfile, builder.WithPredicates(profileFormatChanged)).
		Watches(&cdiv1.CDI{}, everyCron, builder.WithPredicates(workloadChanged)).
		Watches(&cdiv1.CDIConfig{}, everyCron, builder.WithPredicates(configStatusChanged))
	if served {
		b = b.Watches(&snapshotv1.VolumeSnapshot{}, byLabel, builder.WithPredicates(labelled, predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				return snapshotReady(e.ObjectOld.(*snapshotv1.VolumeSnapshot)) != snapshotReady(e.ObjectNew.(*snapshotv1.VolumeSnapshot))
			},
		}))
	}
	return b.Complete(r)
}

func registerOutdatedGauge() error {
	if err := ctrlmetrics.Registry.Register(outdatedGauge); err != nil {
		var already prometheus.AlreadyRegisteredError
		if !errors.As(err, &already) {
			return fmt.Errorf("registering %s: %w", "kubevirt_cdi_dataimportcron_outdated", err)
		}
	}
	return nil
}

func (r *DataImportCronReconciler) cronsMatching(ctx context.Context, c client.Reader, match func(*cdiv1.DataImportCron) bool) []reconcile.Request {
	crons := &cdiv1.DataImportCronList{}
	if err := c.List(ctx, crons); err != nil {
		log.FromContext(ctx).Error(err, "listing DataImportCrons")
		return nil
	}
	var out []reconcile.Request
	for i := range crons.Items {
		if match(&crons.Items[i]) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&crons.Items[i])})
		}
	}
	return out
}

// Reconcile implements reconcile.Reconciler.
func (r *DataImportCronReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	cron := &cdiv1.DataImportCron{}
	if err := r.Client.Get(ctx, req.NamespacedName, cron); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.cleanup(ctx, req.NamespacedName, logger)
	}
	if cron.DeletionTimestamp != nil {
		return ctrl.Result{}, r.cleanup(ctx, req.NamespacedName, logger)
	}
	if managed, err := r.managesDataSource(ctx, cron); err != nil || !managed {
		return ctrl.Result{}, err
	}
	orig := cron.DeepCopy()
	poller, err := r.ensurePoller(ctx, cron)
	if err != nil {
		return ctrl.Result{}, err
	}
	res, err := r.update(ctx, cron, poller, logger)
	if err != nil {
		return res, err
	}
	return res, r.persist(ctx, orig, cron)
}

// persist writes what update changed: the annotations with a merge patch of
// only the changed keys (the poller patches others meanwhile), then the status.
func (r *DataImportCronReconciler) persist(ctx context.Context, orig, cron *cdiv1.DataImportCron) error {
	changed := map[string]any{}
	for k, v := range cron.Annotations {
		if ov, ok := orig.Annotations[k]; !ok || ov != v {
			changed[k] = v
		}
	}
	if len(changed) > 0 {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": changed}})
		if err != nil {
			return err
		}
		status := cron.Status.DeepCopy()
		if err := r.Client.Patch(ctx, cron, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return fmt.Errorf("updating the annotations of DataImportCron %s/%s: %w", cron.Namespace, cron.Name, err)
		}
		cron.Status = *status
	}
	if !equality.Semantic.DeepEqual(orig.Status, cron.Status) {
		// A merge patch: the cached cron may trail our own last write.
		base := cron.DeepCopy()
		base.Status = orig.Status
		if err := r.Client.Status().Patch(ctx, cron, client.MergeFrom(base)); err != nil {
			return fmt.Errorf("updating the status of DataImportCron %s/%s: %w", cron.Namespace, cron.Name, err)
		}
	}
	return nil
}

// managesDataSource is false when another cron that names the same
// DataSource holds its label: CDI's ErrDataSourceAlreadyManaged.
func (r *DataImportCronReconciler) managesDataSource(ctx context.Context, cron *cdiv1.DataImportCron) (bool, error) {
	ds := &cdiv1.DataSource{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: cron.Namespace, Name: cron.Spec.ManagedDataSource}, ds); err != nil {
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	holder := ds.Labels[cdiv1.LabelDataImportCron]
	if holder == "" || holder == cron.Name {
		return true, nil
	}
	other := &cdiv1.DataImportCron{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: cron.Namespace, Name: holder}, other); err != nil {
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}
	if other.Spec.ManagedDataSource == ds.Name {
		r.event(cron, corev1.EventTypeWarning, ErrDataSourceAlreadyManaged, "DataSource %s is already managed by DataImportCron %s", ds.Name, other.Name)
		return false, nil
	}
	return true, nil
}

func registrySource(cron *cdiv1.DataImportCron) *cdiv1.DataVolumeSourceRegistry {
	if s := cron.Spec.Template.Spec.Source; s != nil {
		return s.Registry
	}
	return nil
}

func pvcSource(cron *cdiv1.DataImportCron) *cdiv1.DataVolumeSourcePVC {
	if s := cron.Spec.Template.Spec.Source; s != nil {
		return s.PVC
	}
	return nil
}

func isURLSource(cron *cdiv1.DataImportCron) bool {
	reg := registrySource(cron)
	return reg != nil && reg.URL != nil && *reg.URL != ""
}

// pollerState is what ensurePoller found: Problem says why the poller
// cannot run (a Secret or ConfigMap the cron names is missing from its
// namespace); Copies, that it uses copies to keep refreshed.
type pollerState struct {
	Problem string
	Copies  bool
}

// ensurePoller makes the CronJob and the initial Job of a registry URL
// source, with copies of the registry Secret and CA the cron names, or
// starts the controller's own poll of a pvc source.
func (r *DataImportCronReconciler) ensurePoller(ctx context.Context, cron *cdiv1.DataImportCron) (pollerState, error) {
	var st pollerState
	if cron.Spec.Schedule == "" {
		return st, nil
	}
	if pvcSource(cron) != nil {
		if cron.Annotations[cdiv1.AnnNextCronTime] == "" {
			setAnnotation(cron, cdiv1.AnnNextCronTime, r.now().UTC().Format(time.RFC3339))
		}
		return st, nil
	}
	if !isURLSource(cron) {
		return st, nil
	}
	if r.Namespace == "" {
		r.event(cron, corev1.EventTypeWarning, ReasonPollerNotStarted, "the controller has no install namespace (POD_NAMESPACE) to run the poller CronJob in")
		return st, nil
	}
	reg := registrySource(cron)
	st.Copies = ptr.Deref(reg.SecretRef, "") != "" || ptr.Deref(reg.CertConfigMap, "") != ""
	src, problem, err := r.readPollerSources(ctx, cron)
	if err != nil {
		return st, err
	}
	if problem != "" {
		// No copy outlives its source; the poller starts once it is there.
		st.Problem = "the poller cannot start: " + problem
		return st, r.ensurePollerCopies(ctx, cron, pollerSources{}, nil)
	}
	p, err := r.pollerSpec(ctx, cron)
	if err != nil {
		return st, err
	}
	if src.secret != nil {
		p.Secret = PollerCopyName(cron)
	}
	if src.configMap != nil {
		p.CertConfigMap = PollerCopyName(cron)
	}
	cj := &batchv1.CronJob{}
	err = r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: CronJobName(cron)}, cj)
	switch {
	case err == nil:
		want := cj.DeepCopy()
		applyCronJob(want, cron, p)
		if !equality.Semantic.DeepEqual(cj, want) {
			if err := r.Client.Update(ctx, want); client.IgnoreNotFound(err) != nil {
				return st, fmt.Errorf("updating the poller CronJob %s/%s: %w", r.Namespace, cj.Name, err)
			}
		}
		return st, r.ensurePollerCopies(ctx, cron, src, cj)
	case !apierrors.IsNotFound(err):
		return st, err
	}
	cj = newPollerCronJob(cron, r.Namespace, p)
	if err := r.Client.Create(ctx, cj); err != nil && !apierrors.IsAlreadyExists(err) {
		return st, fmt.Errorf("creating the poller CronJob %s/%s: %w", r.Namespace, cj.Name, err)
	}
	// Before the initial Job, whose pod needs them at once.
	if err := r.ensurePollerCopies(ctx, cron, src, cj); err != nil {
		return st, err
	}
	job := newInitialJob(cron, r.Namespace, p)
	if err := r.Client.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
		return st, fmt.Errorf("creating the poller's initial Job %s/%s: %w", r.Namespace, job.Name, err)
	}
	return st, nil
}

func (r *DataImportCronReconciler) pollerSpec(ctx context.Context, cron *cdiv1.DataImportCron) (pollerSpec, error) {
	p := pollerSpec{Image: r.Image, PullPolicy: r.PullPolicy, ServiceAccount: r.ServiceAccount}
	placement, err := populators.ReadWorkloadPlacement(ctx, r.Client)
	if err != nil {
		return p, fmt.Errorf("placing the poller of DataImportCron %s/%s: %w", cron.Namespace, cron.Name, err)
	}
	p.Placement = placement
	if p.PullPolicy, err = populators.ReadWorkerPullPolicy(ctx, r.Client, r.PullPolicy); err != nil {
		return p, fmt.Errorf("choosing the pull policy of DataImportCron %s/%s's poller: %w", cron.Namespace, cron.Name, err)
	}
	config := &cdiv1.CDIConfig{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); err != nil {
		if !apierrors.IsNotFound(err) {
			return p, fmt.Errorf("reading CDIConfig for the poller of DataImportCron %s/%s: %w", cron.Namespace, cron.Name, err)
		}
		return p, nil
	}
	p.Insecure = populators.InsecureRegistry(ptr.Deref(registrySource(cron).URL, ""), config)
	p.Proxy = config.Status.ImportProxy
	p.ProxyCA = populators.TrustedCAProxy(config)
	if len(config.Status.ImagePullSecrets) > 0 {
		p.PullSecrets = append([]corev1.LocalObjectReference(nil), config.Status.ImagePullSecrets...)
	}
	return p, nil
}

func setAnnotation(obj metav1.Object, key, value string) {
	a := obj.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[key] = value
	obj.SetAnnotations(a)
}

// currentImport reads the DataVolume and claim of the cron's current import.
func (r *DataImportCronReconciler) currentImport(ctx context.Context, cron *cdiv1.DataImportCron) (*cdiv1.DataVolume, *corev1.PersistentVolumeClaim, error) {
	if len(cron.Status.CurrentImports) == 0 {
		return nil, nil, nil
	}
	key := types.NamespacedName{Namespace: cron.Namespace, Name: cron.Status.CurrentImports[0].DataVolumeName}
	dv := &cdiv1.DataVolume{}
	if err := r.Client.Get(ctx, key, dv); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, nil, err
		}
		dv = nil
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Client.Get(ctx, key, pvc); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, nil, err
		}
		pvc = nil
	}
	return dv, pvc, nil
}

func (r *DataImportCronReconciler) currentSnapshot(ctx context.Context, cron *cdiv1.DataImportCron) (*snapshotv1.VolumeSnapshot, error) {
	if !r.snapshots || len(cron.Status.CurrentImports) == 0 {
		return nil, nil
	}
	snap := &snapshotv1.VolumeSnapshot{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: cron.Namespace, Name: cron.Status.CurrentImports[0].DataVolumeName}, snap)
	if err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return nil, nil
		}
		return nil, err
	}
	return snap, nil
}

func snapshotReady(s *snapshotv1.VolumeSnapshot) bool {
	return s != nil && s.Status != nil && ptr.Deref(s.Status.ReadyToUse, false)
}

// update is one pass of CDI's cron logic over the current import.
func (r *DataImportCronReconciler) update(ctx context.Context, cron *cdiv1.DataImportCron, poller pollerState, logger logr.Logger) (ctrl.Result, error) {
	res := ctrl.Result{}
	now := r.now()
	dv, pvc, err := r.currentImport(ctx, cron)
	if err != nil {
		return res, err
	}
	imports := cron.Status.CurrentImports
	classes := &storagev1.StorageClassList{}
	if err := r.Client.List(ctx, classes); err != nil {
		return res, err
	}
	desiredClass := EffectiveStorageClass(&cron.Spec.Template, classes.Items)
	if desiredClass != "" {
		if pvc != nil && pvc.Status.Phase == corev1.ClaimPending && pvc.Labels[cdiv1.LabelDataImportCron] == cron.Name &&
			pvc.Spec.StorageClassName != nil && *pvc.Spec.StorageClassName != desiredClass {
			logger.Info("deleting the pending import claim on the old storage class", "claim", pvc.Name, "class", *pvc.Spec.StorageClassName, "desired", desiredClass)
			if err := r.Client.Delete(ctx, pvc); client.IgnoreNotFound(err) != nil {
				return res, err
			}
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		if current, ok := cron.Annotations[cdiv1.AnnStorageClass]; ok && current != desiredClass {
			logger.Info("storage class changed: deleting the newest import to redo it", "from", current, "to", desiredClass)
			if err := r.storageClassChanged(ctx, cron, desiredClass); err != nil {
				return res, err
			}
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		setAnnotation(cron, cdiv1.AnnStorageClass, desiredClass)
	}
	format, err := r.sourceFormat(ctx, desiredClass)
	if err != nil {
		return res, err
	}
	snap, err := r.currentSnapshot(ctx, cron)
	if err != nil {
		return res, err
	}
	state := importState{Format: format, Importing: len(imports) > 0}
	populated := func() error {
		if pvc != nil {
			if err := r.touch(ctx, cron, pvc, now); err != nil {
				return err
			}
		}
		state.Succeeded = true
		if format == cdiv1.DataImportCronSourceFormatSnapshot && pvc != nil {
			return r.snapshotImport(ctx, cron, pvc, desiredClass, now)
		}
		return nil
	}
	switch {
	case dv != nil:
		state.DVPhase = dv.Status.Phase
		if dv.Status.Phase == cdiv1.Succeeded {
			if err := populated(); err != nil {
				return res, err
			}
		}
	case pvc != nil && pvc.Status.Phase == corev1.ClaimBound:
		if err := populated(); err != nil {
			return res, err
		}
	case snap != nil:
		if format == cdiv1.DataImportCronSourceFormatPvc {
			if err := r.Client.Delete(ctx, snap); client.IgnoreNotFound(err) != nil {
				return res, err
			}
			logger.Info("format switched to pvc: deleted the import's snapshot", "snapshot", snap.Name)
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		if err := r.touch(ctx, cron, snap, now); err != nil {
			return res, err
		}
		state.Succeeded = true
	default:
		if len(imports) > 0 {
			// The import's objects are gone: it is no longer current.
			imports = imports[1:]
			cron.Status.CurrentImports = imports
			state.Importing = len(imports) > 0
		}
	}
	if snap == nil && state.Succeeded && format == cdiv1.DataImportCronSourceFormatSnapshot {
		// snapshotImport may just have made it.
		if snap, err = r.currentSnapshot(ctx, cron); err != nil {
			return res, err
		}
	}
	state.Snapshot, state.SnapshotReady = snap != nil, snapshotReady(snap)
	nowMeta := metav1.NewTime(now)
	// Set once at the end: a refusal below replaces it.
	progress := progressingCondition(state)
	if state.Succeeded {
		last := &cdiv1.DataVolumeSourcePVC{Namespace: cron.Namespace, Name: imports[0].DataVolumeName}
		if cron.Status.LastImportedPVC == nil || *cron.Status.LastImportedPVC != *last {
			cron.Status.LastImportedPVC = last
			cron.Status.LastImportTimestamp = &nowMeta
		}
		if CollectsGarbage(cron) {
			if err := r.collectGarbage(ctx, cron, logger); err != nil {
				return res, err
			}
		}
	}
	if err := r.updateDataSource(ctx, cron, format); err != nil {
		return res, err
	}
	auth := r.cloneAuthorization(ctx, cron)
	if pvcSource(cron) != nil && cron.Spec.Schedule != "" {
		if res, err = r.pollPVC(ctx, cron, now, auth); err != nil {
			return res, err
		}
	}
	desired := cron.Annotations[cdiv1.AnnSourceDesiredDigest]
	state.DigestUpdated = desired != "" && (len(imports) == 0 || desired != imports[0].Digest)
	if state.DigestUpdated {
		if dv != nil && erroneous(dv) {
			logger.Info("a new digest replaces the failed import", "dataVolume", dv.Name)
			if err := r.Client.Delete(ctx, dv); client.IgnoreNotFound(err) != nil {
				return res, err
			}
			cron.Status.CurrentImports, imports = nil, nil
		}
		if state.Succeeded || len(imports) == 0 {
			if err := r.createImport(ctx, cron, desired, now, auth); err != nil {
				return res, err
			}
		}
	} else if state.Succeeded {
		cron.Status.SourceFormat = ptr.To(format)
	}
	// What stops the cron shows in Progressing, with a Warning event when
	// it starts or changes, and is looked at again soon.
	blocked := func(c cronCondition, retry time.Duration) {
		progress = c
		if cur := findCronCondition(cron, cdiv1.DataImportCronProgressing); cur == nil || cur.Reason != c.Reason || cur.Message != c.Message {
			r.event(cron, corev1.EventTypeWarning, c.Reason, "%s", c.Message)
		}
		res = requeueWithin(res, retry)
	}
	if refusal := auth.refusal(); refusal != "" {
		blocked(notAuthorizedCondition(refusal), orDuration(r.NotAuthorizedRetry, DefaultNotAuthorizedRetry))
	}
	if poller.Problem != "" {
		blocked(cronCondition{corev1.ConditionFalse, ReasonPollerNotStarted, poller.Problem}, orDuration(r.PollerCopyResync, DefaultPollerCopyResync))
	} else if poller.Copies {
		res = requeueWithin(res, orDuration(r.PollerCopyResync, DefaultPollerCopyResync))
	}
	setCronCondition(cron, cdiv1.DataImportCronProgressing, progress, nowMeta)
	if c, ok := upToDateCondition(state); ok {
		setCronCondition(cron, cdiv1.DataImportCronUpToDate, c, nowMeta)
	}
	r.setOutdatedGauge(cron)
	if s := cron.Annotations[cdiv1.AnnLastCronTime]; s != "" {
		if t, err := time.Parse(time.RFC3339, s); err == nil {
			if ts := cron.Status.LastExecutionTimestamp; ts == nil || !ts.Time.Equal(t) {
				cron.Status.LastExecutionTimestamp = &metav1.Time{Time: t}
			}
		}
	}
	return res, nil
}

// setOutdatedGauge mirrors the UpToDate condition into the gauge; pending
// says the import waits for a default storage class.
func (r *DataImportCronReconciler) setOutdatedGauge(cron *cdiv1.DataImportCron) {
	c := findCronCondition(cron, cdiv1.DataImportCronUpToDate)
	upToDate := c != nil && c.Status == corev1.ConditionTrue
	pending := false
	if !upToDate {
		_, hasClass := cron.Annotations[cdiv1.AnnStorageClass]
		pending = !hasClass && TemplateStorageClass(&cron.Spec.Template) == ""
	}
	outdatedGauge.DeletePartialMatch(prometheus.Labels{"ns": cron.Namespace, "cron_name": cron.Name})
	v := 0.0
	if !upToDate {
		v = 1
	}
	outdatedGauge.With(prometheus.Labels{"ns": cron.Namespace, "cron_name": cron.Name, "pending": strconv.FormatBool(pending)}).Set(v)
}

// touch refreshes an import's last use and its cron labels.
func (r *DataImportCronReconciler) touch(ctx context.Context, cron *cdiv1.DataImportCron, obj client.Object, now time.Time) error {
	before := obj.DeepCopyObject().(client.Object)
	setAnnotation(obj, cdiv1.AnnLastUseTime, now.UTC().Format(time.RFC3339Nano))
	l := obj.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	for k, v := range cronResourceLabels(cron) {
		l[k] = v
	}
	obj.SetLabels(l)
	if err := r.Client.Patch(ctx, obj, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("marking %s %s/%s used: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// sourceFormat is the StorageProfile's dataImportCronSourceFormat, pvc by default.
func (r *DataImportCronReconciler) sourceFormat(ctx context.Context, class string) (cdiv1.DataImportCronSourceFormat, error) {
	if class == "" {
		return cdiv1.DataImportCronSourceFormatPvc, nil
	}
	p := &cdiv1.StorageProfile{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: class}, p); err != nil {
		if apierrors.IsNotFound(err) {
			return cdiv1.DataImportCronSourceFormatPvc, nil
		}
		return "", err
	}
	if f := p.Status.DataImportCronSourceFormat; f != nil && *f == cdiv1.DataImportCronSourceFormatSnapshot && r.snapshots {
		return cdiv1.DataImportCronSourceFormatSnapshot, nil
	}
	return cdiv1.DataImportCronSourceFormatPvc, nil
}

// storageClassChanged deletes the newest import (snapshot, DataVolume,
// claim) so that it is redone on the new class, then records the class.
func (r *DataImportCronReconciler) storageClassChanged(ctx context.Context, cron *cdiv1.DataImportCron, class string) error {
	digest := cron.Annotations[cdiv1.AnnSourceDesiredDigest]
	if digest != "" {
		name, err := ImportName(cron.Spec.ManagedDataSource, digest)
		if err != nil {
			return err
		}
		om := metav1.ObjectMeta{Name: name, Namespace: cron.Namespace}
		objs := []client.Object{&cdiv1.DataVolume{ObjectMeta: om}, &corev1.PersistentVolumeClaim{ObjectMeta: om}}
		if r.snapshots {
			objs = append([]client.Object{&snapshotv1.VolumeSnapshot{ObjectMeta: om}}, objs...)
		}
		for _, o := range objs {
			if err := r.Client.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
		for _, o := range objs {
			if err := r.Client.Get(ctx, client.ObjectKeyFromObject(o), o); err == nil || !apierrors.IsNotFound(err) {
				return fmt.Errorf("waiting for the import %s on the old storage class to be removed", name)
			}
		}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{cdiv1.AnnStorageClass: class}}})
	if err != nil {
		return err
	}
	return r.Client.Patch(ctx, cron, client.RawPatch(types.MergePatchType, patch))
}

// updateDataSource creates the managed DataSource if missing and points it
// at the last import; a DataSource without the cron's label is left alone.
func (r *DataImportCronReconciler) updateDataSource(ctx context.Context, cron *cdiv1.DataImportCron, format cdiv1.DataImportCronSourceFormat) error {
	ds := &cdiv1.DataSource{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: cron.Namespace, Name: cron.Spec.ManagedDataSource}, ds)
	switch {
	case apierrors.IsNotFound(err):
		ds = &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Name: cron.Spec.ManagedDataSource, Namespace: cron.Namespace, Labels: cronResourceLabels(cron)}}
		if src := dataSourceSourceFor(format, cron.Status.LastImportedPVC); src != nil {
			ds.Spec.Source = *src
		}
		if err := r.Client.Create(ctx, ds); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating DataSource %s/%s: %w", ds.Namespace, ds.Name, err)
		}
		return nil
	case err != nil:
		return err
	}
	if ds.Labels[cdiv1.LabelDataImportCron] != cron.Name {
		return nil
	}
	before := ds.DeepCopy()
	for k, v := range cronResourceLabels(cron) {
		ds.Labels[k] = v
	}
	if src := dataSourceSourceFor(format, cron.Status.LastImportedPVC); src != nil {
		ds.Spec.Source = *src
	}
	if equality.Semantic.DeepEqual(before, ds) {
		return nil
	}
	if err := r.Client.Update(ctx, ds); err != nil {
		return fmt.Errorf("pointing DataSource %s/%s at the last import: %w", ds.Namespace, ds.Name, err)
	}
	return nil
}

// createImport makes the DataVolume of the desired digest, unless a claim
// or snapshot of that name already holds it.
func (r *DataImportCronReconciler) createImport(ctx context.Context, cron *cdiv1.DataImportCron, digest string, now time.Time, auth *cronAuthorization) error {
	name, err := ImportName(cron.Spec.ManagedDataSource, digest)
	if err != nil {
		r.event(cron, corev1.EventTypeWarning, "InvalidDigest", "cannot import digest %q: %v", digest, err)
		return nil
	}
	key := types.NamespacedName{Namespace: cron.Namespace, Name: name}
	existing := []client.Object{&corev1.PersistentVolumeClaim{}}
	if r.snapshots {
		existing = append([]client.Object{&snapshotv1.VolumeSnapshot{}}, existing...)
	}
	for _, o := range existing {
		if err := r.Client.Get(ctx, key, o); err == nil {
			cron.Status.CurrentImports = []cdiv1.ImportStatus{{DataVolumeName: name, Digest: digest}}
			return r.touch(ctx, cron, o, now)
		} else if !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
			return err
		}
	}
	// The DataVolume is created by the controller, so its clone is
	// authorised here for the cron's ServiceAccount, every time, not only
	// when the cron was admitted: rights may have been taken away since, and
	// the cron may have been created while the webhooks were not there.
	if ok, err := auth.allowed(); err != nil || !ok {
		return err
	}
	cron.Status.CurrentImports = []cdiv1.ImportStatus{{DataVolumeName: name, Digest: digest}}
	dv := ImportDataVolume(cron, name, digest, now)
	if err := r.Client.Create(ctx, dv); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the import DataVolume %s/%s: %w", dv.Namespace, dv.Name, err)
	}
	return nil
}

// pollPVC is the controller's own poll of a pvc source: at each scheduled
// time the digest becomes uid:<the source claim's UID>.
func (r *DataImportCronReconciler) pollPVC(ctx context.Context, cron *cdiv1.DataImportCron, now time.Time, auth *cronAuthorization) (ctrl.Result, error) {
	sched, err := cronexpr.ParseStandard(cron.Spec.Schedule)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("schedule %q: %w", cron.Spec.Schedule, err)
	}
	next, err := time.Parse(time.RFC3339, cron.Annotations[cdiv1.AnnNextCronTime])
	if err != nil || !next.After(now) {
		// The claim is read, and its UID recorded, only for a cron whose
		// ServiceAccount may clone it; a refused poll stays due.
		if ok, err := auth.allowed(); err != nil || !ok {
			return ctrl.Result{}, err
		}
		src := pvcSource(cron)
		ns := src.Namespace
		if ns == "" {
			ns = cron.Namespace
		}
		claim := &corev1.PersistentVolumeClaim{}
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: src.Name}, claim); err != nil {
			if !apierrors.IsNotFound(err) {
				return ctrl.Result{}, err
			}
			r.event(cron, corev1.EventTypeWarning, "SourcePVCNotFound", "source PVC %s/%s does not exist", ns, src.Name)
		} else {
			setAnnotation(cron, cdiv1.AnnLastCronTime, now.UTC().Format(time.RFC3339))
			setAnnotation(cron, cdiv1.AnnSourceDesiredDigest, digestUIDPrefix+string(claim.UID))
		}
	}
	n := sched.Next(now)
	setAnnotation(cron, cdiv1.AnnNextCronTime, n.UTC().Format(time.RFC3339))
	return ctrl.Result{RequeueAfter: n.Sub(now)}, nil
}

// cronAuthorization is whether a cron's ServiceAccount may clone the source
// of its imports, asked at most once per reconcile and only when needed.
type cronAuthorization struct {
	run    func() (bool, string, error)
	done   bool
	ok     bool
	reason string
	err    error
}

func (r *DataImportCronReconciler) cloneAuthorization(ctx context.Context, cron *cdiv1.DataImportCron) *cronAuthorization {
	return &cronAuthorization{run: func() (bool, string, error) {
		ok, reason, err := cloneauth.Authorizer{Client: r.Client}.AuthorizeCron(ctx, cron)
		if err != nil {
			return false, "", fmt.Errorf("authorising the source of DataImportCron %s/%s for its ServiceAccount: %w", cron.Namespace, cron.Name, err)
		}
		return ok, reason, nil
	}}
}

func (a *cronAuthorization) allowed() (bool, error) {
	if !a.done {
		a.ok, a.reason, a.err = a.run()
		a.done = true
	}
	return a.ok, a.err
}

// refusal is the reason the cron was refused in this reconcile, or "".
func (a *cronAuthorization) refusal() string {
	if !a.done || a.ok || a.err != nil {
		return ""
	}
	return a.reason
}

// requeueWithin makes res come back within d at the latest.
func requeueWithin(res ctrl.Result, d time.Duration) ctrl.Result {
	if res.RequeueAfter <= 0 || res.RequeueAfter > d {
		res.RequeueAfter = d
	}
	return res
}

// orDuration is d, or def when d is not positive.
func orDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
