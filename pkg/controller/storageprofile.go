package controller

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/storage"
)

// Names the integration tests read here; they are defined with the storage
// rules in pkg/storage.
const (
	LocalTestDriver         = storage.LocalTestDriver
	NoProvisioner           = storage.NoProvisioner
	AnnDefaultSnapshotClass = storage.AnnDefaultSnapshotClass

	ReasonKnownProvisioner        = storage.ReasonKnownProvisioner
	ReasonUserClaimPropertySets   = storage.ReasonUserClaimPropertySets
	ReasonUnknownProvisioner      = storage.ReasonUnknownProvisioner
	ReasonInvalidClaimPropertySet = storage.ReasonInvalidClaimPropertySet
	ReasonStaticVolumes           = storage.ReasonStaticVolumes
)

// conflictRetry is how soon a reconcile that lost an update race runs again.
const conflictRetry = 200 * time.Millisecond

// ProfileMetricLabels are the labels of kubevirt_cdi_storageprofile_info.
func ProfileMetricLabels(sc *storagev1.StorageClass, status cdiv1.StorageProfileStatus, smartClone bool) prometheus.Labels {
	complete := storage.Unsupported(sc.Provisioner) || storage.ClaimPropertySetsComplete(status.ClaimPropertySets)
	rwx := false
	for _, set := range status.ClaimPropertySets {
		if slices.Contains(set.AccessModes, corev1.ReadWriteMany) {
			rwx = true
		}
	}
	strategy := ""
	if status.CloneStrategy != nil {
		strategy = string(*status.CloneStrategy)
	}
	return prometheus.Labels{
		"storageclass":   sc.Name,
		"provisioner":    sc.Provisioner,
		"clone_strategy": strategy,
		"complete":       strconv.FormatBool(complete),
		"default":        strconv.FormatBool(storage.IsDefaultClass(sc)),
		"virtdefault":    strconv.FormatBool(storage.IsVirtDefaultClass(sc)),
		"rwx":            strconv.FormatBool(rwx),
		"smartclone":     strconv.FormatBool(smartClone),
		"degraded":       strconv.FormatBool(!rwx || !smartClone),
	}
}

// storageProfileInfo is kubevirt_cdi_storageprofile_info: one series per
// StorageClass, value 1, the facts in its labels.
var storageProfileInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "kubevirt_cdi_storageprofile_info",
	Help: "StorageProfiles info labels: storageclass, provisioner, clone_strategy, " +
		"complete (the recommended PVC settings are known), default (the Kubernetes default class), " +
		"virtdefault (the default virtualization class), rwx (ReadWriteMany is supported), " +
		"smartclone (snapshot or CSI clone is possible), degraded (no rwx or no smart clone)",
}, []string{"storageclass", "provisioner", "clone_strategy", "complete", "default", "virtdefault", "rwx", "smartclone", "degraded"})

func init() {
	metrics.Registry.MustRegister(storageProfileInfo)
}

// volumeSnapshotClassGVK is the kind the reconciler watches when its CRD exists.
var volumeSnapshotClassGVK = schema.GroupVersionKind{Group: snapshotv1.GroupName, Version: "v1", Kind: "VolumeSnapshotClass"}

// StorageProfileReconciler keeps one StorageProfile per StorageClass, named
// after it, and deletes the profile when its class goes.
type StorageProfileReconciler struct {
	Client client.Client
	// Recorder, when set, receives Warning events about bad user input.
	Recorder events.EventRecorder

	// snapshotsServed is set at setup when the VolumeSnapshotClass CRD exists.
	snapshotsServed bool
}

// SetupWithManager registers the reconciler. It watches StorageClasses,
// StorageProfiles and, when that CRD is installed at setup time,
// VolumeSnapshotClasses (a CRD installed later needs a restart).
func (r *StorageProfileReconciler) SetupWithManager(mgr ctrl.Manager) error {
	logger := mgr.GetLogger().WithName("storageprofile")
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	served, err := snapshotKindServed(mgr, volumeSnapshotClassGVK)
	if err != nil {
		return err
	}
	r.snapshotsServed = served
	b := ctrl.NewControllerManagedBy(mgr).
		Named("storageprofile").
		For(&storagev1.StorageClass{}).
		Watches(&cdiv1.StorageProfile{}, &handler.EnqueueRequestForObject{}).
		Watches(&corev1.PersistentVolume{}, handler.EnqueueRequestsFromMapFunc(r.staticClassOf)).
		Watches(&storagev1.CSIDriver{}, handler.EnqueueRequestsFromMapFunc(r.classesOfCSIDriver))
	if served {
		b = b.Watches(&snapshotv1.VolumeSnapshotClass{}, handler.EnqueueRequestsFromMapFunc(r.classesOfDriver))
		logger.Info("watching VolumeSnapshotClasses")
	} else {
		logger.Info("VolumeSnapshotClass CRD not installed; every profile without a spec clone strategy gets copy")
	}
	if err := b.Complete(r); err != nil {
		return fmt.Errorf("building the StorageProfile controller: %w", err)
	}
	return nil
}

// kindServed asks the manager's RESTMapper whether the API serves gvk.
func kindServed(mgr ctrl.Manager, gvk schema.GroupVersionKind) (bool, error) {
	_, err := mgr.GetRESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
	switch {
	case err == nil:
		return true, nil
	case meta.IsNoMatchError(err):
		return false, nil
	}
	return false, fmt.Errorf("looking up %s in the API: %w", gvk, err)
}

// snapshotKindServed is kindServed for a snapshot.storage.k8s.io kind, and
// when it is served adds that API to the manager's scheme, so the
// controllers that watch snapshots only when their CRDs exist can.
func snapshotKindServed(mgr ctrl.Manager, gvk schema.GroupVersionKind) (bool, error) {
	served, err := kindServed(mgr, gvk)
	if err != nil || !served || mgr.GetScheme().Recognizes(gvk) {
		return served, err
	}
	if err := snapshotv1.AddToScheme(mgr.GetScheme()); err != nil {
		return false, fmt.Errorf("adding snapshot.storage.k8s.io/v1 to the scheme: %w", err)
	}
	return true, nil
}

// staticClassOf maps a PersistentVolume to its class when that class has no
// provisioner, the only case where volumes shape a profile.
func (r *StorageProfileReconciler) staticClassOf(ctx context.Context, obj client.Object) []reconcile.Request {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.StorageClassName == "" {
		return nil
	}
	sc := &storagev1.StorageClass{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: pv.Spec.StorageClassName}, sc); err != nil || sc.Provisioner != storage.NoProvisioner {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: sc.Name}}}
}

// classesOfCSIDriver maps a CSIDriver to the classes it provisions for:
// whether it is registered decides if csi-clone counts as a smart clone.
func (r *StorageProfileReconciler) classesOfCSIDriver(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.classesWithProvisioner(ctx, obj.GetName())
}

// classesWithProvisioner lists the StorageClasses of one provisioner as requests.
func (r *StorageProfileReconciler) classesWithProvisioner(ctx context.Context, provisioner string) []reconcile.Request {
	var classes storagev1.StorageClassList
	if err := r.Client.List(ctx, &classes); err != nil {
		log.FromContext(ctx).Error(err, "listing StorageClasses", "provisioner", provisioner)
		return nil
	}
	var reqs []reconcile.Request
	for _, sc := range classes.Items {
		if sc.Provisioner == provisioner {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: sc.Name}})
		}
	}
	return reqs
}

// classesOfDriver maps a VolumeSnapshotClass to the StorageClasses of its
// driver, plus every class whose profile names it in spec.snapshotClass.
func (r *StorageProfileReconciler) classesOfDriver(ctx context.Context, obj client.Object) []reconcile.Request {
	vsc, ok := obj.(*snapshotv1.VolumeSnapshotClass)
	if !ok {
		return nil
	}
	var classes storagev1.StorageClassList
	if err := r.Client.List(ctx, &classes); err != nil {
		log.FromContext(ctx).Error(err, "listing StorageClasses for a VolumeSnapshotClass change", "volumeSnapshotClass", vsc.Name)
		return nil
	}
	var profiles cdiv1.StorageProfileList
	if err := r.Client.List(ctx, &profiles); err != nil {
		log.FromContext(ctx).Error(err, "listing StorageProfiles for a VolumeSnapshotClass change", "volumeSnapshotClass", vsc.Name)
	}
	named := map[string]bool{}
	for _, p := range profiles.Items {
		if p.Spec.SnapshotClass != nil && *p.Spec.SnapshotClass == vsc.Name {
			named[p.Name] = true
		}
	}
	var reqs []reconcile.Request
	for _, sc := range classes.Items {
		if sc.Provisioner == vsc.Driver || named[sc.Name] {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: sc.Name}})
		}
	}
	return reqs
}

// Reconcile brings the StorageProfile named req.Name in line with its class.
func (r *StorageProfileReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx).WithValues("storageClass", req.Name)

	// Read.
	sc := &storagev1.StorageClass{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: req.Name}, sc); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, r.deleteProfile(ctx, logger, req.Name)
		}
		return ctrl.Result{}, fmt.Errorf("reading StorageClass %s: %w", req.Name, err)
	}
	if sc.DeletionTimestamp != nil {
		return ctrl.Result{}, r.deleteProfile(ctx, logger, req.Name)
	}
	profile := &cdiv1.StorageProfile{}
	exists := true
	if err := r.Client.Get(ctx, types.NamespacedName{Name: sc.Name}, profile); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("reading StorageProfile %s: %w", sc.Name, err)
		}
		exists = false
	}
	var snapshotClasses []snapshotv1.VolumeSnapshotClass
	if r.snapshotsServed {
		var list snapshotv1.VolumeSnapshotClassList
		if err := r.Client.List(ctx, &list); err != nil {
			return ctrl.Result{}, fmt.Errorf("listing VolumeSnapshotClasses: %w", err)
		}
		snapshotClasses = list.Items
	}

	var pvs []corev1.PersistentVolume
	if sc.Provisioner == storage.NoProvisioner && len(profile.Spec.ClaimPropertySets) == 0 {
		var list corev1.PersistentVolumeList
		if err := r.Client.List(ctx, &list); err != nil {
			return ctrl.Result{}, fmt.Errorf("listing PersistentVolumes for class %s without a provisioner: %w", sc.Name, err)
		}
		pvs = list.Items
	}

	// Decide.
	d := storage.DecideStorageProfile(sc, profile.Spec, snapshotClasses, pvs)

	// Act.
	if !exists {
		profile = &cdiv1.StorageProfile{
			ObjectMeta: metav1.ObjectMeta{
				Name:   sc.Name,
				Labels: map[string]string{cdiv1.LabelApp: cdiv1.LabelAppValue, cdiv1.LabelAppManagedBy: "kubefill"},
			},
		}
		if err := r.Client.Create(ctx, profile); err != nil {
			if apierrors.IsAlreadyExists(err) {
				// Created meanwhile (the cache lags): the retry decides on what is there.
				return ctrl.Result{}, fmt.Errorf("creating StorageProfile %s: it appeared meanwhile, retrying: %w", sc.Name, err)
			}
			return ctrl.Result{}, fmt.Errorf("creating StorageProfile %s: %w", sc.Name, err)
		}
		logger.Info("created StorageProfile")
	}
	desired := profile.Status.DeepCopy()
	conditions := desired.Conditions
	*desired = d.Status
	desired.Conditions = conditions
	d.Recognized.ObservedGeneration = profile.Generation
	meta.SetStatusCondition(&desired.Conditions, d.Recognized)
	if !equality.Semantic.DeepEqual(*desired, profile.Status) {
		profile.Status = *desired
		if err := r.Client.Status().Update(ctx, profile); err != nil {
			if apierrors.IsConflict(err) {
				// The cache was behind the object; decide again on a fresh read.
				logger.V(1).Info("StorageProfile changed since read; retrying")
				return ctrl.Result{RequeueAfter: conflictRetry}, nil
			}
			return ctrl.Result{}, fmt.Errorf("updating StorageProfile %s status: %w", sc.Name, err)
		}
		logger.Info("updated StorageProfile status", "cloneStrategy", *d.Status.CloneStrategy, "cloneStrategyFrom", d.CloneStrategyFrom,
			"snapshotClass", ptrString(d.Status.SnapshotClass), "claimPropertySets", len(d.Status.ClaimPropertySets), "recognized", d.Recognized.Reason)
		for _, note := range d.Notes {
			logger.Info("StorageProfile input problem", "problem", note)
			if r.Recorder != nil {
				r.Recorder.Eventf(profile, nil, corev1.EventTypeWarning, "InvalidConfiguration", "Reconcile", "%s", note)
			}
		}
	}

	csiDriverExists := false
	if d.Status.CloneStrategy != nil && *d.Status.CloneStrategy == cdiv1.CloneStrategyCsiClone {
		driver := &storagev1.CSIDriver{}
		err := r.Client.Get(ctx, types.NamespacedName{Name: sc.Provisioner}, driver)
		switch {
		case err == nil:
			csiDriverExists = true
		case !apierrors.IsNotFound(err):
			return ctrl.Result{}, fmt.Errorf("reading CSIDriver %s: %w", sc.Provisioner, err)
		}
	}
	setProfileMetric(ProfileMetricLabels(sc, d.Status, storage.SmartCloneFor(d.Status, csiDriverExists)))
	return ctrl.Result{}, nil
}

// setProfileMetric replaces the series of one StorageClass.
func setProfileMetric(labels prometheus.Labels) {
	storageProfileInfo.DeletePartialMatch(prometheus.Labels{"storageclass": labels["storageclass"]})
	storageProfileInfo.With(labels).Set(1)
}

// deleteProfile removes the profile and metric series of a deleted class.
func (r *StorageProfileReconciler) deleteProfile(ctx context.Context, logger logr.Logger, name string) error {
	storageProfileInfo.DeletePartialMatch(prometheus.Labels{"storageclass": name})
	profile := &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := r.Client.Delete(ctx, profile); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("deleting StorageProfile %s of a deleted StorageClass: %w", name, err)
	}
	logger.Info("deleted StorageProfile of a deleted StorageClass")
	return nil
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
