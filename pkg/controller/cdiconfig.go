package controller

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/storage"
)

// CDI's default worker pod resources, used where CDIConfig's spec is silent.
const (
	DefaultPodCPURequest    = "100m"
	DefaultPodMemoryRequest = "60M"
	DefaultPodCPULimit      = "750m"
	DefaultPodMemoryLimit   = "600M"
)

// percentPattern is the syntax of a Percent, as the CRD validates it.
var percentPattern = regexp.MustCompile(`^(0(?:\.\d{1,3})?|1)$`)

// ValidPercent reports whether p is a fraction from "0" to "1" with at most
// three decimals.
func ValidPercent(p cdiv1.Percent) bool { return percentPattern.MatchString(string(p)) }

// DefaultPodResourceRequirements returns CDI's defaults with every resource
// the spec names (cpu and memory, requests and limits) replaced by the spec's.
func DefaultPodResourceRequirements(spec *corev1.ResourceRequirements) *corev1.ResourceRequirements {
	out := &corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse(DefaultPodCPURequest),
			corev1.ResourceMemory: resource.MustParse(DefaultPodMemoryRequest),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse(DefaultPodCPULimit),
			corev1.ResourceMemory: resource.MustParse(DefaultPodMemoryLimit),
		},
	}
	if spec == nil {
		return out
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := spec.Requests[name]; ok {
			out.Requests[name] = q.DeepCopy()
		}
		if q, ok := spec.Limits[name]; ok {
			out.Limits[name] = q.DeepCopy()
		}
	}
	return out
}

// FilesystemOverheadFor returns the overhead in force: the spec's global
// value or DefaultFilesystemOverhead, and an entry for every class in
// classes, the spec's value for it or the global one. Invalid values are an
// error naming them; the caller then keeps the old status.
func FilesystemOverheadFor(spec *cdiv1.FilesystemOverhead, classes []string) (*cdiv1.FilesystemOverhead, error) {
	out := &cdiv1.FilesystemOverhead{Global: cdiv1.DefaultFilesystemOverhead, StorageClass: map[string]cdiv1.Percent{}}
	var bad []string
	if spec != nil && spec.Global != "" {
		if ValidPercent(spec.Global) {
			out.Global = spec.Global
		} else {
			bad = append(bad, fmt.Sprintf("spec.filesystemOverhead.global %q", spec.Global))
		}
	}
	for _, name := range classes {
		out.StorageClass[name] = out.Global
		if spec == nil {
			continue
		}
		if p, ok := spec.StorageClass[name]; ok {
			if !ValidPercent(p) {
				bad = append(bad, fmt.Sprintf("spec.filesystemOverhead.storageClass[%s] %q", name, p))
				continue
			}
			out.StorageClass[name] = p
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("invalid filesystem overhead %s: give a fraction from 0 to 1 with at most three decimals, e.g. \"0.06\"", strings.Join(bad, ", "))
	}
	return out, nil
}

// ScratchSpaceStorageClassFor picks the class for scratch space: the spec's
// when that class exists, else the cluster's default class (storage's one
// rule: the newest if several claim it, as Kubernetes does), else "".
func ScratchSpaceStorageClassFor(spec *string, classes []storagev1.StorageClass) string {
	if spec != nil {
		for i := range classes {
			if classes[i].Name == *spec {
				return *spec
			}
		}
	}
	return storage.DefaultClassName(classes)
}

// emptyImportProxy is what CDI reports when no proxy is configured: every
// field present and empty.
func emptyImportProxy() *cdiv1.ImportProxy {
	return &cdiv1.ImportProxy{HTTPProxy: new(string), HTTPSProxy: new(string), NoProxy: new(string), TrustedCAProxy: new(string)}
}

// CDIConfigStatusFor computes the CDIConfig status from its spec, the
// StorageClasses and the upload proxy URL the controller was given ("" for
// none). Fields it does not own (uploadProxyCA) are kept from current.
func CDIConfigStatusFor(spec cdiv1.CDIConfigSpec, current cdiv1.CDIConfigStatus, classes []storagev1.StorageClass, uploadProxyURL string) (cdiv1.CDIConfigStatus, error) {
	out := cdiv1.CDIConfigStatus{UploadProxyCA: current.UploadProxyCA}

	switch {
	case spec.UploadProxyURLOverride != nil:
		v := *spec.UploadProxyURLOverride
		out.UploadProxyURL = &v
	case uploadProxyURL != "":
		v := uploadProxyURL
		out.UploadProxyURL = &v
	}

	names := make([]string, 0, len(classes))
	for i := range classes {
		names = append(names, classes[i].Name)
	}
	sort.Strings(names)
	overhead, err := FilesystemOverheadFor(spec.FilesystemOverhead, names)
	if err != nil {
		return cdiv1.CDIConfigStatus{}, err
	}
	out.FilesystemOverhead = overhead

	out.ScratchSpaceStorageClass = ScratchSpaceStorageClassFor(spec.ScratchSpaceStorageClass, classes)
	out.DefaultPodResourceRequirements = DefaultPodResourceRequirements(spec.PodResourceRequirements)
	out.Preallocation = spec.Preallocation != nil && *spec.Preallocation
	if spec.ImportProxy != nil {
		out.ImportProxy = spec.ImportProxy.DeepCopy()
	} else {
		out.ImportProxy = emptyImportProxy()
	}
	if len(spec.ImagePullSecrets) > 0 {
		out.ImagePullSecrets = append([]corev1.LocalObjectReference(nil), spec.ImagePullSecrets...)
	}
	return out, nil
}

// AnnConfigAuthority on the CDI resource makes its spec.config the
// CDIConfig's spec, as CDI's operator does.
const AnnConfigAuthority = "cdi.kubevirt.io/configAuthority"

// cdiPhaseError is the phase of a CDI resource that is not the active one.
const cdiPhaseError cdiv1.CDIPhase = "Error"

// ConfigSpecFromCDI decides whether the CDI resource dictates the CDIConfig
// spec: only the active CDI (the only one, or the only one not in phase
// Error) carrying AnnConfigAuthority does; its spec.config, or an empty spec,
// is then the CDIConfig spec. Several active CDI resources are an error.
func ConfigSpecFromCDI(cdis []cdiv1.CDI) (spec cdiv1.CDIConfigSpec, authoritative bool, err error) {
	active := cdis
	if len(cdis) > 1 {
		active = nil
		for i := range cdis {
			if cdis[i].Status.Phase != cdiPhaseError {
				active = append(active, cdis[i])
			}
		}
		if len(active) != 1 {
			return spec, false, fmt.Errorf("%d active CDI resources; keep exactly one", len(active))
		}
	}
	if len(active) == 0 {
		return spec, false, nil
	}
	if _, ok := active[0].Annotations[AnnConfigAuthority]; !ok {
		return spec, false, nil
	}
	if active[0].Spec.Config != nil {
		spec = *active[0].Spec.Config.DeepCopy()
	}
	return spec, true, nil
}

// DefaultCDIConfigSpec is the spec of a CDIConfig Kubefill creates with no
// CDI resource to copy one from: the spec.config of the CDI resource CDI's
// release ships, which honours WaitForFirstConsumer.
func DefaultCDIConfigSpec() cdiv1.CDIConfigSpec {
	return cdiv1.CDIConfigSpec{FeatureGates: []string{cdiv1.FeatureGateHonorWaitForFirstConsumer}}
}

// CDIConfigReconciler creates the singleton CDIConfig "config" when it is
// absent and keeps its status: the values in force for every consumer.
type CDIConfigReconciler struct {
	Client client.Client
	// UploadProxyURL is reported as status.uploadProxyURL unless the spec
	// overrides it; "" reports none (flag --uploadproxy-url).
	UploadProxyURL string
	// Recorder, when set, receives Warning events about bad configuration.
	Recorder events.EventRecorder
}

// configRequest is the one key this reconciler works on.
var configRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: cdiv1.CDIConfigName}}

// SetupWithManager registers the reconciler. Any change to the CDIConfig, a
// StorageClass or the CDI resource reconciles the singleton; so does the
// start itself, so that the config is created on a fresh cluster.
func (r *CDIConfigReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	toConfig := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{configRequest}
	})
	err := ctrl.NewControllerManagedBy(mgr).
		Named("cdiconfig").
		For(&cdiv1.CDIConfig{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetName() == cdiv1.CDIConfigName
		}))).
		Watches(&storagev1.StorageClass{}, toConfig).
		Watches(&cdiv1.CDI{}, toConfig).
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			q.Add(configRequest)
			return nil
		})).
		Complete(r)
	if err != nil {
		return fmt.Errorf("building the CDIConfig controller: %w", err)
	}
	return nil
}

// Reconcile creates the CDIConfig if needed and brings its status up to date.
func (r *CDIConfigReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx).WithValues("cdiConfig", cdiv1.CDIConfigName)

	// Read (creating the singleton if absent).
	var cdis cdiv1.CDIList
	if err := r.Client.List(ctx, &cdis); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing CDI resources: %w", err)
	}
	cdiSpec, authoritative, err := ConfigSpecFromCDI(cdis.Items)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("deciding whether the CDI resource owns the CDIConfig spec: %w", err)
	}
	config := &cdiv1.CDIConfig{}
	if err := r.Client.Get(ctx, configRequest.NamespacedName, config); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("reading CDIConfig %s: %w", cdiv1.CDIConfigName, err)
		}
		config = &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{
			Name:   cdiv1.CDIConfigName,
			Labels: map[string]string{cdiv1.LabelApp: cdiv1.LabelAppValue, cdiv1.LabelAppManagedBy: "kubefill"},
		}}
		if authoritative {
			config.Spec = cdiSpec
		} else {
			config.Spec = DefaultCDIConfigSpec()
		}
		if err := r.Client.Create(ctx, config); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return reconcile.Result{}, fmt.Errorf("creating CDIConfig %s: it appeared meanwhile, retrying: %w", cdiv1.CDIConfigName, err)
			}
			return reconcile.Result{}, fmt.Errorf("creating CDIConfig %s: %w", cdiv1.CDIConfigName, err)
		}
		logger.Info("created CDIConfig")
	}
	if authoritative && !equality.Semantic.DeepEqual(config.Spec, cdiSpec) {
		config.Spec = cdiSpec
		if err := r.Client.Update(ctx, config); err != nil {
			if apierrors.IsConflict(err) {
				logger.V(1).Info("CDIConfig changed since read; retrying")
				return reconcile.Result{RequeueAfter: conflictRetry}, nil
			}
			return reconcile.Result{}, fmt.Errorf("copying the CDI resource's spec.config into CDIConfig %s: %w", cdiv1.CDIConfigName, err)
		}
		logger.Info("CDIConfig spec replaced by the CDI resource's spec.config", "annotation", AnnConfigAuthority)
	}
	var classes storagev1.StorageClassList
	if err := r.Client.List(ctx, &classes); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing StorageClasses: %w", err)
	}

	// Decide.
	status, err := CDIConfigStatusFor(config.Spec, config.Status, classes.Items, r.UploadProxyURL)
	if err != nil {
		if r.Recorder != nil {
			r.Recorder.Eventf(config, nil, corev1.EventTypeWarning, "InvalidConfiguration", "Reconcile", "%s", err.Error())
		}
		return reconcile.Result{}, fmt.Errorf("CDIConfig %s status left as it was: %w", cdiv1.CDIConfigName, err)
	}

	// Act.
	if equality.Semantic.DeepEqual(status, config.Status) {
		return reconcile.Result{}, nil
	}
	config.Status = status
	if err := r.Client.Status().Update(ctx, config); err != nil {
		if apierrors.IsConflict(err) {
			logger.V(1).Info("CDIConfig changed since read; retrying")
			return reconcile.Result{RequeueAfter: conflictRetry}, nil
		}
		return reconcile.Result{}, fmt.Errorf("updating CDIConfig %s status: %w", cdiv1.CDIConfigName, err)
	}
	logger.Info("updated CDIConfig status", "uploadProxyURL", ptrString(status.UploadProxyURL),
		"scratchSpaceStorageClass", status.ScratchSpaceStorageClass, "filesystemOverhead", status.FilesystemOverhead.Global,
		"storageClasses", len(status.FilesystemOverhead.StorageClass), "preallocation", status.Preallocation)
	return reconcile.Result{}, nil
}
