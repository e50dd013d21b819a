package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/kit"
)

// snapshotCRDModule ships the snapshot.storage.k8s.io CRD YAMLs: the
// snapshot client the controller is built with, at the version go.mod
// requires.
const snapshotCRDModule = "github.com/kubernetes-csi/external-snapshotter/client/v6"

var installSnapshotCRDsOnce struct {
	sync.Once
	err error
}

// installSnapshotCRDs installs VolumeSnapshot, VolumeSnapshotContent and
// VolumeSnapshotClass into the shared control plane, once per package run.
func installSnapshotCRDs(t *testing.T) {
	t.Helper()
	installSnapshotCRDsOnce.Do(func() {
		cmd := exec.Command("go", "mod", "download", "-json", snapshotCRDModule)
		cmd.Dir = repoRoot()
		out, err := cmd.Output()
		if err != nil {
			installSnapshotCRDsOnce.err = fmt.Errorf("locating %s with go mod download: %w", snapshotCRDModule, err)
			return
		}
		var mod struct{ Dir string }
		if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
			installSnapshotCRDsOnce.err = fmt.Errorf("reading go mod download output %q: %v", out, err)
			return
		}
		var paths []string
		for _, kind := range []string{"volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"} {
			paths = append(paths, filepath.Join(mod.Dir, "config", "crd", "snapshot.storage.k8s.io_"+kind+".yaml"))
		}
		started := time.Now()
		_, err = envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{Paths: paths, ErrorIfPathMissing: true})
		if err != nil {
			installSnapshotCRDsOnce.err = fmt.Errorf("installing the snapshot CRDs: %w", err)
			return
		}
		fmt.Printf("snapshot CRDs from %s installed in %s\n", mod.Dir, time.Since(started).Round(time.Millisecond))
	})
	if installSnapshotCRDsOnce.err != nil {
		t.Fatal(installSnapshotCRDsOnce.err)
	}
}

// snapshotClient is a direct client that also knows snapshot.storage.k8s.io/v1.
func snapshotClient(t *testing.T) client.Client {
	t.Helper()
	s := controller.NewScheme()
	if err := snapshotv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startReconcilers runs a manager holding only the given reconcilers until
// the test ends, and waits for it to stop then.
func startReconcilers(t *testing.T, setups ...func(ctrl.Manager) error) {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		// The product's scheme as it is: the StorageProfile reconciler adds
		// the snapshot types itself when their CRD is served.
		Scheme:                 controller.NewScheme(),
		Logger:                 testr.NewWithOptions(t, testr.Options{LogTimestamp: true}),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatalf("building manager: %v", err)
	}
	for _, setup := range setups {
		if err := setup(mgr); err != nil {
			t.Fatalf("registering reconciler: %v", err)
		}
	}
	startUntilCleanup(t, mgr)
}

// createStorageClass creates a class that is deleted when the test ends.
func createStorageClass(t *testing.T, name, provisioner string, annotations, params map[string]string) *storagev1.StorageClass {
	t.Helper()
	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Annotations: annotations},
		Provisioner: provisioner,
		Parameters:  params,
	}
	if err := k8sClient.Create(context.Background(), sc); err != nil {
		t.Fatalf("creating StorageClass %s: %v", name, err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), sc) })
	return sc
}

// profileStatus reads a StorageProfile; ok is false while it is missing.
func profileStatus(t *testing.T, name string) (cdiv1.StorageProfile, bool) {
	t.Helper()
	p := cdiv1.StorageProfile{}
	err := k8sClient.Get(context.Background(), types.NamespacedName{Name: name}, &p)
	if apierrors.IsNotFound(err) {
		return p, false
	}
	if err != nil {
		t.Fatalf("reading StorageProfile %s: %v", name, err)
	}
	return p, true
}

// waitProfile waits until the profile of class name satisfies cond, and
// returns it.
func waitProfile(t *testing.T, name, what string, cond func(p cdiv1.StorageProfile) bool) cdiv1.StorageProfile {
	t.Helper()
	var p cdiv1.StorageProfile
	took := kit.Eventually(t, 20*time.Second, kit.Interval, "StorageProfile "+name+" "+what, func() (bool, string, error) {
		var ok bool
		p, ok = profileStatus(t, name)
		return ok && cond(p), fmt.Sprintf("found=%v status %+v", ok, p.Status), nil
	})
	t.Logf("StorageProfile %s %s after %s", name, what, took.Round(time.Millisecond))
	return p
}

func strategyIs(want cdiv1.CDICloneStrategy) func(cdiv1.StorageProfile) bool {
	return func(p cdiv1.StorageProfile) bool {
		return p.Status.CloneStrategy != nil && *p.Status.CloneStrategy == want
	}
}

// profileSets renders claim property sets, e.g. "RWO/Filesystem RWO/Block".
func profileSets(s []cdiv1.ClaimPropertySet) string {
	var parts []string
	for _, set := range s {
		var modes []string
		for _, m := range set.AccessModes {
			modes = append(modes, map[corev1.PersistentVolumeAccessMode]string{corev1.ReadWriteOnce: "RWO", corev1.ReadWriteMany: "RWX", corev1.ReadOnlyMany: "ROX"}[m])
		}
		vm := "<nil>"
		if set.VolumeMode != nil {
			vm = string(*set.VolumeMode)
		}
		parts = append(parts, strings.Join(modes, ",")+"/"+vm)
	}
	return strings.Join(parts, " ")
}

// profileMetric returns the labels of the kubevirt_cdi_storageprofile_info
// series of one class and its value; found is false when there is none.
func profileMetric(t *testing.T, storageClass string) (labels map[string]string, value float64, found bool) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != "kubevirt_cdi_storageprofile_info" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["storageclass"] == storageClass {
				if found {
					t.Errorf("two series for storageclass %s", storageClass)
				}
				labels, value, found = l, m.GetGauge().GetValue(), true
			}
		}
	}
	return labels, value, found
}

// deletePV deletes a PersistentVolume. envtest runs no pv-protection
// controller, so the protection finalizer is dropped by hand first.
func deletePV(t *testing.T, name string) {
	ctx := context.Background()
	pv := &corev1.PersistentVolume{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Name: name}, pv); err != nil {
		return
	}
	pv.Finalizers = nil
	if err := k8sClient.Update(ctx, pv); err != nil {
		t.Errorf("dropping finalizers of PersistentVolume %s: %v", name, err)
	}
	if err := k8sClient.Delete(ctx, pv); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting PersistentVolume %s: %v", name, err)
	}
}

// snapshotCRDServed asks discovery whether VolumeSnapshotClass is served.
func snapshotCRDServed(t *testing.T) bool {
	t.Helper()
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	if err != nil {
		t.Fatal(err)
	}
	_, err = mapper.RESTMapping(snapshotv1.SchemeGroupVersion.WithKind("VolumeSnapshotClass").GroupKind(), "v1")
	if meta.IsNoMatchError(err) {
		return false
	}
	if err != nil {
		t.Fatalf("asking discovery for VolumeSnapshotClass: %v", err)
	}
	return true
}

// TestStorageProfileWithoutSnapshotCRDs runs the reconciler on a cluster that
// does not serve VolumeSnapshotClass: setup must not fail, and profiles get
// copy. It only runs while the package has not installed the CRDs yet.
func TestStorageProfileWithoutSnapshotCRDs(t *testing.T) {
	if snapshotCRDServed(t) {
		t.Skip("the snapshot CRDs are already installed in this control plane; the no-CRD path cannot be tested here")
	}
	startReconcilers(t, (&controller.StorageProfileReconciler{}).SetupWithManager)
	name := "kf-sp-nocrd-" + rand.String(5)
	createStorageClass(t, name, controller.LocalTestDriver, nil, nil)
	p := waitProfile(t, name, "to get a clone strategy", strategyIs(cdiv1.CloneStrategyHostAssisted))
	if p.Status.SnapshotClass != nil {
		t.Errorf("snapshotClass = %q without the CRD", *p.Status.SnapshotClass)
	}
	if got := profileSets(p.Status.ClaimPropertySets); got != "RWO/Filesystem RWO/Block" {
		t.Errorf("claimPropertySets = %s", got)
	}
	if err := k8sClient.Delete(context.Background(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 20*time.Second, "the profile of the deleted class to go", func() bool {
		_, ok := profileStatus(t, name)
		return !ok
	})
}

// TestStorageProfileLifecycle checks the StorageProfile reconciler against a
// real apiserver: profiles appear for classes, follow VolumeSnapshotClasses,
// the class annotation and the user's spec, and go with their class.
func TestStorageProfileLifecycle(t *testing.T) {
	installSnapshotCRDs(t)
	ctx := context.Background()
	sc := snapshotClient(t)
	startReconcilers(t, func(mgr ctrl.Manager) error {
		return (&controller.StorageProfileReconciler{Recorder: mgr.GetEventRecorder("storageprofile")}).SetupWithManager(mgr)
	})
	suffix := rand.String(5)
	// A driver name of our own, so that other tests' snapshot classes do not
	// change what this one expects; the local test driver's claim
	// properties are checked on the annotated class below.
	driver := "sp-" + suffix + ".csi.kubefill.test"

	// 1. A class with no snapshot class: copy, unknown driver.
	plain := "kf-sp-plain-" + suffix
	createStorageClass(t, plain, driver, map[string]string{cdiv1.AnnDefaultVirtStorageClass: "true"}, nil)
	p := waitProfile(t, plain, "to be created with copy", strategyIs(cdiv1.CloneStrategyHostAssisted))
	if ptr.Deref(p.Status.StorageClass, "") != plain || ptr.Deref(p.Status.Provisioner, "") != driver {
		t.Errorf("status storageClass/provisioner = %v/%v", p.Status.StorageClass, p.Status.Provisioner)
	}
	if len(p.Status.ClaimPropertySets) != 0 || p.Status.SnapshotClass != nil {
		t.Errorf("unknown driver got sets %s, snapshot class %v", profileSets(p.Status.ClaimPropertySets), p.Status.SnapshotClass)
	}
	cond := meta.FindStatusCondition(p.Status.Conditions, cdiv1.StorageProfileRecognized)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != controller.ReasonUnknownProvisioner || !strings.Contains(cond.Message, "spec.claimPropertySets") {
		t.Errorf("Recognized = %+v, want False/UnknownProvisioner telling to set spec.claimPropertySets", cond)
	}
	// The series is set right after the status is written.
	kit.Until(t, 10*time.Second, "kubevirt_cdi_storageprofile_info for "+plain, func() bool {
		_, _, found := profileMetric(t, plain)
		return found
	})
	labels, value, _ := profileMetric(t, plain)
	if value != 1 || labels["complete"] != "false" || labels["virtdefault"] != "true" || labels["default"] != "false" || labels["rwx"] != "false" ||
		labels["smartclone"] != "false" || labels["degraded"] != "true" || labels["clone_strategy"] != "copy" || labels["provisioner"] != driver {
		t.Errorf("kubevirt_cdi_storageprofile_info{storageclass=%s} = %v %v", plain, labels, value)
	}
	t.Logf("kubevirt_cdi_storageprofile_info%v %v", labels, value)

	// 2. A VolumeSnapshotClass for the driver turns it to snapshot.
	first := &snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: "kf-sp-b-" + suffix}, Driver: driver, DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete}
	if err := sc.Create(ctx, first); err != nil {
		t.Fatalf("creating VolumeSnapshotClass: %v", err)
	}
	t.Cleanup(func() { _ = sc.Delete(context.Background(), first) })
	p = waitProfile(t, plain, "to switch to snapshot", strategyIs(cdiv1.CloneStrategySnapshot))
	if ptr.Deref(p.Status.SnapshotClass, "") != first.Name {
		t.Errorf("snapshotClass = %v, want %s", p.Status.SnapshotClass, first.Name)
	}
	kit.Until(t, 10*time.Second, "the metric to say smartclone", func() bool {
		l, _, ok := profileMetric(t, plain)
		return ok && l["smartclone"] == "true" && l["clone_strategy"] == "snapshot"
	})

	// 3. A second class annotated as the default wins, though later by name.
	def := &snapshotv1.VolumeSnapshotClass{
		ObjectMeta: metav1.ObjectMeta{Name: "kf-sp-z-" + suffix, Annotations: map[string]string{controller.AnnDefaultSnapshotClass: "true"}},
		Driver:     driver, DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete,
	}
	if err := sc.Create(ctx, def); err != nil {
		t.Fatalf("creating VolumeSnapshotClass: %v", err)
	}
	t.Cleanup(func() { _ = sc.Delete(context.Background(), def) })
	waitProfile(t, plain, "to pick the default VolumeSnapshotClass", func(p cdiv1.StorageProfile) bool {
		return ptr.Deref(p.Status.SnapshotClass, "") == def.Name
	})

	// 4. The user's spec: claim property sets and clone strategy win.
	p, _ = profileStatus(t, plain)
	block := corev1.PersistentVolumeBlock
	p.Spec.ClaimPropertySets = []cdiv1.ClaimPropertySet{{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeMode: &block}}
	p.Spec.CloneStrategy = ptr.To(cdiv1.CloneStrategyCsiClone)
	if err := k8sClient.Update(ctx, &p); err != nil {
		t.Fatalf("updating StorageProfile spec: %v", err)
	}
	p = waitProfile(t, plain, "to take the user's spec", func(p cdiv1.StorageProfile) bool {
		return strategyIs(cdiv1.CloneStrategyCsiClone)(p) && profileSets(p.Status.ClaimPropertySets) == "RWX/Block"
	})
	cond = meta.FindStatusCondition(p.Status.Conditions, cdiv1.StorageProfileRecognized)
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != controller.ReasonUserClaimPropertySets || cond.ObservedGeneration != p.Generation {
		t.Errorf("Recognized = %+v, want True/UserClaimPropertySets at generation %d", cond, p.Generation)
	}
	kit.Until(t, 10*time.Second, "the metric to say complete and rwx", func() bool {
		l, _, ok := profileMetric(t, plain)
		// No CSIDriver object exists for the driver, so csi-clone is no smart clone.
		return ok && l["complete"] == "true" && l["rwx"] == "true" && l["clone_strategy"] == "csi-clone" && l["smartclone"] == "false"
	})

	// A registered CSIDriver makes csi-clone a smart clone.
	csiDriver := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driver}}
	if err := k8sClient.Create(ctx, csiDriver); err != nil {
		t.Fatalf("creating CSIDriver: %v", err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), csiDriver) })
	kit.Until(t, 10*time.Second, "the metric to say smartclone for csi-clone with a CSIDriver", func() bool {
		l, _, ok := profileMetric(t, plain)
		return ok && l["smartclone"] == "true" && l["degraded"] == "false"
	})

	// 5. The clone-strategy annotation beats the snapshot class, and the
	// local test driver's claim properties come from the table.
	annotated := "kf-sp-annotated-" + suffix
	createStorageClass(t, annotated, driver, map[string]string{cdiv1.AnnCloneStrategy: "copy"}, nil)
	p = waitProfile(t, annotated, "to get copy from the annotation", strategyIs(cdiv1.CloneStrategyHostAssisted))
	if ptr.Deref(p.Status.SnapshotClass, "") != def.Name {
		t.Errorf("snapshotClass = %v, want %s (still reported)", p.Status.SnapshotClass, def.Name)
	}
	local := "kf-sp-local-" + suffix
	createStorageClass(t, local, controller.LocalTestDriver, map[string]string{cdiv1.AnnCloneStrategy: "csi-clone"}, nil)
	p = waitProfile(t, local, "to get csi-clone from the annotation", strategyIs(cdiv1.CloneStrategyCsiClone))
	if got := profileSets(p.Status.ClaimPropertySets); got != "RWO/Filesystem RWO/Block" {
		t.Errorf("%s claimPropertySets = %s", local, got)
	}
	cond = meta.FindStatusCondition(p.Status.Conditions, cdiv1.StorageProfileRecognized)
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != controller.ReasonKnownProvisioner {
		t.Errorf("Recognized = %+v, want True/KnownProvisioner", cond)
	}
	// A clone-strategy annotation that means nothing is ignored, with a
	// Warning event on the profile.
	bogus := "kf-sp-bogus-" + suffix
	createStorageClass(t, bogus, driver, map[string]string{cdiv1.AnnCloneStrategy: "teleport"}, nil)
	waitProfile(t, bogus, "to ignore a bad annotation", strategyIs(cdiv1.CloneStrategySnapshot))
	kit.Until(t, 10*time.Second, "a Warning event about the bad annotation", func() bool {
		var list eventsv1.EventList
		if err := k8sClient.List(ctx, &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Regarding.Kind == "StorageProfile" && e.Regarding.Name == bogus && e.Type == corev1.EventTypeWarning &&
				e.Reason == "InvalidConfiguration" && strings.Contains(e.Note, "teleport") {
				t.Logf("event: %s", e.Note)
				return true
			}
		}
		return false
	})

	ceph := "kf-sp-ceph-" + suffix
	createStorageClass(t, ceph, "rook-ceph.rbd.csi.ceph.com", nil, map[string]string{"pool": "replicapool"})
	p = waitProfile(t, ceph, "to get the rbd advice", func(p cdiv1.StorageProfile) bool { return len(p.Status.ClaimPropertySets) > 0 })
	if got := profileSets(p.Status.ClaimPropertySets); got != "RWX/Block RWO/Block RWO/Filesystem" {
		t.Errorf("%s claimPropertySets = %s", ceph, got)
	}

	// 6. Deleting the default VolumeSnapshotClass moves the profile to the
	// remaining one; the spec's csi-clone stays.
	if err := sc.Delete(ctx, def); err != nil {
		t.Fatal(err)
	}
	waitProfile(t, plain, "to fall back to the remaining VolumeSnapshotClass", func(p cdiv1.StorageProfile) bool {
		return ptr.Deref(p.Status.SnapshotClass, "") == first.Name && strategyIs(cdiv1.CloneStrategyCsiClone)(p)
	})

	// 7. A deleted class takes its profile and its metric series along.
	started := time.Now()
	if err := k8sClient.Delete(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: plain}}); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 20*time.Second, "the profile of a deleted class to go", func() bool {
		_, ok := profileStatus(t, plain)
		return !ok
	})
	t.Logf("StorageProfile %s deleted %s after its class", plain, time.Since(started).Round(time.Millisecond))
	if _, _, found := profileMetric(t, plain); found {
		t.Errorf("metric series for deleted class %s still exported", plain)
	}

	// 8. A profile written by hand for a class that does not exist is removed.
	orphan := &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: "kf-sp-orphan-" + suffix}}
	if err := k8sClient.Create(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 20*time.Second, "the orphan profile to be removed", func() bool {
		_, ok := profileStatus(t, orphan.Name)
		return !ok
	})

	// 9. A class without a provisioner takes its claim properties from the
	// PersistentVolumes made by hand for it.
	static := "kf-sp-static-" + suffix
	createStorageClass(t, static, controller.NoProvisioner, nil, nil)
	p = waitProfile(t, static, "to be created", func(p cdiv1.StorageProfile) bool {
		return meta.FindStatusCondition(p.Status.Conditions, cdiv1.StorageProfileRecognized) != nil
	})
	if cond = meta.FindStatusCondition(p.Status.Conditions, cdiv1.StorageProfileRecognized); cond.Status != metav1.ConditionFalse || len(p.Status.ClaimPropertySets) != 0 {
		t.Errorf("class without volumes: Recognized %+v, sets %s", cond, profileSets(p.Status.ClaimPropertySets))
	}
	volume := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "kf-sp-static-pv-" + suffix},
		Spec: corev1.PersistentVolumeSpec{
			StorageClassName:       static,
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:             &block,
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/kf-test"}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{"nowhere"}}},
			}}}},
		},
	}
	if err := k8sClient.Create(ctx, volume); err != nil {
		t.Fatalf("creating PersistentVolume: %v", err)
	}
	t.Cleanup(func() { deletePV(t, volume.Name) })
	p = waitProfile(t, static, "to learn from its PersistentVolume", func(p cdiv1.StorageProfile) bool { return len(p.Status.ClaimPropertySets) > 0 })
	cond = meta.FindStatusCondition(p.Status.Conditions, cdiv1.StorageProfileRecognized)
	if got := profileSets(p.Status.ClaimPropertySets); got != "RWO/Block" || cond.Reason != controller.ReasonStaticVolumes {
		t.Errorf("static class: sets %s, Recognized %+v", got, cond)
	}

	// Clean up: remove the remaining classes while the reconciler runs, so
	// that their profiles go too.
	for _, name := range []string{annotated, local, ceph, static, bogus} {
		if err := k8sClient.Delete(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{annotated, local, ceph, static, bogus} {
		kit.Until(t, 20*time.Second, "profile "+name+" to go", func() bool {
			_, ok := profileStatus(t, name)
			return !ok
		})
	}
}
