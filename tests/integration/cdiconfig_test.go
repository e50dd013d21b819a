package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/kit"
)

// readConfig reads the CDIConfig singleton; ok is false while it is missing.
func readConfig(t *testing.T) (cdiv1.CDIConfig, bool) {
	t.Helper()
	c := cdiv1.CDIConfig{}
	err := k8sClient.Get(context.Background(), types.NamespacedName{Name: cdiv1.CDIConfigName}, &c)
	if apierrors.IsNotFound(err) {
		return c, false
	}
	if err != nil {
		t.Fatalf("reading CDIConfig: %v", err)
	}
	return c, true
}

// deleteConfig removes the CDIConfig singleton and waits until it is gone.
func deleteConfig(t *testing.T) {
	t.Helper()
	err := k8sClient.Delete(context.Background(), &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: cdiv1.CDIConfigName}})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("deleting CDIConfig: %v", err)
	}
	kit.Until(t, 10*time.Second, "the CDIConfig to be gone", func() bool {
		_, ok := readConfig(t)
		return !ok
	})
}

// waitConfig waits until the CDIConfig satisfies cond and returns it.
func waitConfig(t *testing.T, what string, cond func(c cdiv1.CDIConfig) bool) cdiv1.CDIConfig {
	t.Helper()
	var c cdiv1.CDIConfig
	took := kit.Eventually(t, 20*time.Second, kit.Interval, "CDIConfig "+what, func() (bool, string, error) {
		var ok bool
		c, ok = readConfig(t)
		return ok && cond(c), fmt.Sprintf("found=%v spec %+v status %+v", ok, c.Spec, c.Status), nil
	})
	t.Logf("CDIConfig %s after %s", what, took.Round(time.Millisecond))
	return c
}

// overheadCoversAllClasses reports whether the status has exactly one entry
// per StorageClass in the cluster.
func overheadCoversAllClasses(t *testing.T, c cdiv1.CDIConfig) bool {
	t.Helper()
	var classes storagev1.StorageClassList
	if err := k8sClient.List(context.Background(), &classes); err != nil {
		t.Fatal(err)
	}
	o := c.Status.FilesystemOverhead
	if o == nil || len(o.StorageClass) != len(classes.Items) {
		return false
	}
	for _, sc := range classes.Items {
		if _, ok := o.StorageClass[sc.Name]; !ok {
			return false
		}
	}
	return true
}

// TestCDIConfigLifecycle checks the CDIConfig reconciler against a real
// apiserver: it creates the singleton, fills the status with CDI's defaults,
// follows the spec and the StorageClasses.
func TestCDIConfigLifecycle(t *testing.T) {
	ctx := context.Background()
	deleteConfig(t)
	t.Cleanup(func() { deleteConfig(t) }) // runs after the manager has stopped
	const flagURL = "https://upload.kubefill.test:31001"
	startReconcilers(t, func(mgr ctrl.Manager) error {
		return (&controller.CDIConfigReconciler{UploadProxyURL: flagURL, Recorder: mgr.GetEventRecorder("cdiconfig")}).SetupWithManager(mgr)
	})

	// 1. Created with CDI's defaults in its status.
	c := waitConfig(t, "to be created with an overhead for every class", func(c cdiv1.CDIConfig) bool { return overheadCoversAllClasses(t, c) })
	if c.Labels[cdiv1.LabelApp] != cdiv1.LabelAppValue {
		t.Errorf("labels = %v", c.Labels)
	}
	if ptr.Deref(c.Status.UploadProxyURL, "") != flagURL {
		t.Errorf("uploadProxyURL = %v, want the flag's %s", c.Status.UploadProxyURL, flagURL)
	}
	if c.Status.FilesystemOverhead.Global != cdiv1.DefaultFilesystemOverhead {
		t.Errorf("global overhead = %q", c.Status.FilesystemOverhead.Global)
	}
	r := c.Status.DefaultPodResourceRequirements
	if r == nil || r.Requests.Cpu().Cmp(resource.MustParse("100m")) != 0 || r.Requests.Memory().Cmp(resource.MustParse("60M")) != 0 ||
		r.Limits.Cpu().Cmp(resource.MustParse("750m")) != 0 || r.Limits.Memory().Cmp(resource.MustParse("600M")) != 0 {
		t.Errorf("defaultPodResourceRequirements = %v", r)
	}
	if c.Status.Preallocation {
		t.Error("preallocation on by default")
	}
	if p := c.Status.ImportProxy; p == nil || p.HTTPProxy == nil || *p.HTTPProxy != "" || p.NoProxy == nil {
		t.Errorf("importProxy = %+v, want present and empty", p)
	}

	// 2. New classes get an overhead entry; a new default class becomes the scratch class.
	suffix := rand.String(5)
	def := "kf-cc-default-" + suffix
	other := "kf-cc-other-" + suffix
	createStorageClass(t, def, controller.LocalTestDriver, map[string]string{cdiv1.AnnDefaultStorageClass: "true"}, nil)
	createStorageClass(t, other, controller.LocalTestDriver, nil, nil)
	c = waitConfig(t, "to list the new classes", func(c cdiv1.CDIConfig) bool {
		o := c.Status.FilesystemOverhead.StorageClass
		return o[def] == cdiv1.DefaultFilesystemOverhead && o[other] == cdiv1.DefaultFilesystemOverhead
	})
	if c.Status.ScratchSpaceStorageClass != def {
		t.Errorf("scratchSpaceStorageClass = %q, want the default class %s", c.Status.ScratchSpaceStorageClass, def)
	}

	// 3. The spec wins where it speaks.
	c, _ = readConfig(t)
	c.Spec = cdiv1.CDIConfigSpec{
		UploadProxyURLOverride:   ptr.To("https://override.kubefill.test"),
		ScratchSpaceStorageClass: ptr.To(other),
		FilesystemOverhead:       &cdiv1.FilesystemOverhead{Global: "0.1", StorageClass: map[string]cdiv1.Percent{other: "0.25"}},
		Preallocation:            ptr.To(true),
		ImportProxy:              &cdiv1.ImportProxy{HTTPProxy: ptr.To("http://proxy.kubefill.test:3128"), NoProxy: ptr.To(".cluster.local")},
		PodResourceRequirements:  &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}},
		ImagePullSecrets:         []corev1.LocalObjectReference{{Name: "pull-secret"}},
	}
	if err := k8sClient.Update(ctx, &c); err != nil {
		t.Fatalf("updating CDIConfig spec: %v", err)
	}
	c = waitConfig(t, "to follow the spec", func(c cdiv1.CDIConfig) bool { return c.Status.Preallocation && overheadCoversAllClasses(t, c) })
	if ptr.Deref(c.Status.UploadProxyURL, "") != "https://override.kubefill.test" {
		t.Errorf("uploadProxyURL = %v, want the override", c.Status.UploadProxyURL)
	}
	if c.Status.ScratchSpaceStorageClass != other {
		t.Errorf("scratchSpaceStorageClass = %q, want %s", c.Status.ScratchSpaceStorageClass, other)
	}
	o := c.Status.FilesystemOverhead
	if o.Global != "0.1" || o.StorageClass[other] != "0.25" || o.StorageClass[def] != "0.1" {
		t.Errorf("filesystemOverhead = %+v", o)
	}
	if ptr.Deref(c.Status.ImportProxy.HTTPProxy, "") != "http://proxy.kubefill.test:3128" || ptr.Deref(c.Status.ImportProxy.NoProxy, "") != ".cluster.local" {
		t.Errorf("importProxy = %+v", c.Status.ImportProxy)
	}
	r = c.Status.DefaultPodResourceRequirements
	if r.Limits.Cpu().Cmp(resource.MustParse("2")) != 0 || r.Limits.Memory().Cmp(resource.MustParse("600M")) != 0 || r.Requests.Cpu().Cmp(resource.MustParse("100m")) != 0 {
		t.Errorf("defaultPodResourceRequirements = %v, want cpu limit 2 and the other defaults", r)
	}
	if len(c.Status.ImagePullSecrets) != 1 || c.Status.ImagePullSecrets[0].Name != "pull-secret" {
		t.Errorf("imagePullSecrets = %v", c.Status.ImagePullSecrets)
	}

	// 4. A scratch class that goes away falls back to the default; its overhead entry goes too.
	if err := k8sClient.Delete(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: other}}); err != nil {
		t.Fatal(err)
	}
	c = waitConfig(t, "to drop the deleted class", func(c cdiv1.CDIConfig) bool {
		_, listed := c.Status.FilesystemOverhead.StorageClass[other]
		return !listed
	})
	if c.Status.ScratchSpaceStorageClass != def {
		t.Errorf("scratchSpaceStorageClass = %q, want the default %s after %s went", c.Status.ScratchSpaceStorageClass, def, other)
	}

	// 5. Clearing the override falls back to the flag's URL.
	c.Spec.UploadProxyURLOverride = nil
	if err := k8sClient.Update(ctx, &c); err != nil {
		t.Fatalf("updating CDIConfig spec: %v", err)
	}
	waitConfig(t, "to report the flag's URL again", func(c cdiv1.CDIConfig) bool {
		return ptr.Deref(c.Status.UploadProxyURL, "") == flagURL
	})

	// 6. An active CDI resource carrying the config-authority annotation
	// dictates the spec, as CDI's operator does.
	var cdis cdiv1.CDIList
	if err := k8sClient.List(ctx, &cdis); err != nil {
		t.Fatal(err)
	}
	if len(cdis.Items) > 0 {
		t.Logf("skipping the config-authority step: %d CDI resources already exist", len(cdis.Items))
	} else {
		cdi := &cdiv1.CDI{
			ObjectMeta: metav1.ObjectMeta{Name: "kf-cc-cdi-" + suffix, Annotations: map[string]string{controller.AnnConfigAuthority: ""}},
			Spec:       cdiv1.CDISpec{Config: &cdiv1.CDIConfigSpec{ScratchSpaceStorageClass: ptr.To(def), FilesystemOverhead: &cdiv1.FilesystemOverhead{Global: "0.07"}}},
		}
		if err := k8sClient.Create(ctx, cdi); err != nil {
			t.Fatalf("creating CDI resource: %v", err)
		}
		t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), cdi) })
		c = waitConfig(t, "to take the CDI resource's spec.config", func(c cdiv1.CDIConfig) bool {
			return c.Status.FilesystemOverhead.Global == "0.07"
		})
		if c.Spec.Preallocation != nil || c.Status.Preallocation || len(c.Status.ImagePullSecrets) != 0 || ptr.Deref(c.Spec.ScratchSpaceStorageClass, "") != def {
			t.Errorf("spec not replaced whole: spec %+v, status preallocation %v", c.Spec, c.Status.Preallocation)
		}
		if err := k8sClient.Delete(ctx, cdi); err != nil {
			t.Fatal(err)
		}
	}

	// 7. Deleting the config brings it back.
	uid := c.UID
	if err := k8sClient.Delete(ctx, &c); err != nil {
		t.Fatal(err)
	}
	waitConfig(t, "to be recreated after deletion", func(c cdiv1.CDIConfig) bool {
		return c.UID != uid && c.Status.FilesystemOverhead != nil
	})
}
