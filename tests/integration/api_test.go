package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// TestDiscoveryMatchesCDI checks the served resources carry CDI's scopes,
// short names and status subresources, which kubectl and KubeVirt rely on.
func TestDiscoveryMatchesCDI(t *testing.T) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	list, err := dc.ServerResourcesForGroupVersion(cdiv1.SchemeGroupVersion.String())
	if err != nil {
		t.Fatalf("discovering %s: %v", cdiv1.SchemeGroupVersion, err)
	}
	type want struct {
		kind       string
		namespaced bool
		shortNames []string
	}
	wants := map[string]want{
		"datavolumes":         {"DataVolume", true, []string{"dv", "dvs"}},
		"datasources":         {"DataSource", true, []string{"das"}},
		"dataimportcrons":     {"DataImportCron", true, []string{"dic", "dics"}},
		"volumeimportsources": {"VolumeImportSource", true, nil},
		"volumeuploadsources": {"VolumeUploadSource", true, nil},
		"volumeclonesources":  {"VolumeCloneSource", true, nil},
		"storageprofiles":     {"StorageProfile", false, nil},
		"cdiconfigs":          {"CDIConfig", false, nil},
		"cdis":                {"CDI", false, []string{"cdi", "cdis"}},
	}
	served := map[string]metav1.APIResource{}
	for _, r := range list.APIResources {
		served[r.Name] = r
	}
	for name, w := range wants {
		r, ok := served[name]
		if !ok {
			t.Errorf("resource %s is not served", name)
			continue
		}
		if r.Kind != w.kind || r.Namespaced != w.namespaced {
			t.Errorf("%s: kind %s namespaced %v, want %s %v", name, r.Kind, r.Namespaced, w.kind, w.namespaced)
		}
		if len(w.shortNames) > 0 && !reflect.DeepEqual(r.ShortNames, w.shortNames) {
			t.Errorf("%s: short names %v, want %v", name, r.ShortNames, w.shortNames)
		}
	}
	for _, sub := range []string{"datavolumes/status", "datasources/status", "dataimportcrons/status", "storageprofiles/status", "cdiconfigs/status", "cdis/status"} {
		if _, ok := served[sub]; !ok {
			t.Errorf("subresource %s is not served", sub)
		}
	}
}

// TestEveryKindCreatesAndReadsBack writes one object of every kind through
// the typed client and reads it back.
func TestEveryKindCreatesAndReadsBack(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	fs := corev1.PersistentVolumeFilesystem
	copyStrategy := cdiv1.CloneStrategyHostAssisted
	objects := []client.Object{
		&cdiv1.DataVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "dv", Namespace: ns},
			Spec: cdiv1.DataVolumeSpec{
				Source:  &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://example.test/disk.qcow2"}},
				Storage: &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
			},
		},
		&cdiv1.DataSource{
			ObjectMeta: metav1.ObjectMeta{Name: "golden", Namespace: ns},
			Spec:       cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: "fedora"}}},
		},
		// The template's metadata keeps its labels and annotations (an
		// embedded ObjectMeta the CRD schema must not prune).
		&cdiv1.DataImportCron{
			ObjectMeta: metav1.ObjectMeta{Name: "fedora-cron", Namespace: ns},
			Spec: cdiv1.DataImportCronSpec{
				Template: cdiv1.DataVolume{
					ObjectMeta: metav1.ObjectMeta{
						Labels:      map[string]string{cdiv1.LabelDefaultPreference: "fedora"},
						Annotations: map[string]string{cdiv1.AnnImmediateBinding: "true"},
					},
					Spec: cdiv1.DataVolumeSpec{
						Source:  &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To("docker://quay.io/containerdisks/fedora:latest")}},
						Storage: &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")}}},
					},
				},
				Schedule:          "30 1/12 * * *",
				GarbageCollect:    ptr.To(cdiv1.DataImportCronGarbageCollectOutdated),
				ImportsToKeep:     ptr.To[int32](2),
				ManagedDataSource: "fedora",
				RetentionPolicy:   ptr.To(cdiv1.DataImportCronRetainNone),
			},
		},
		&cdiv1.VolumeImportSource{
			ObjectMeta: metav1.ObjectMeta{Name: "import", Namespace: ns},
			Spec: cdiv1.VolumeImportSourceSpec{
				Source:      &cdiv1.ImportSourceType{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To("docker://registry.test/disk:1")}},
				ContentType: cdiv1.DataVolumeKubeVirt,
			},
		},
		&cdiv1.VolumeUploadSource{
			ObjectMeta: metav1.ObjectMeta{Name: "upload", Namespace: ns},
			Spec:       cdiv1.VolumeUploadSourceSpec{ContentType: cdiv1.DataVolumeArchive, Preallocation: ptr.To(true)},
		},
		&cdiv1.VolumeCloneSource{
			ObjectMeta: metav1.ObjectMeta{Name: "clone", Namespace: ns},
			Spec:       cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}},
		},
		&cdiv1.StorageProfile{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-class"},
			Spec: cdiv1.StorageProfileSpec{
				CloneStrategy:     &copyStrategy,
				ClaimPropertySets: []cdiv1.ClaimPropertySet{{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &fs}},
			},
		},
		&cdiv1.CDI{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-cdi"},
			Spec: cdiv1.CDISpec{
				CloneStrategyOverride: &copyStrategy,
				UninstallStrategy:     ptr.To(cdiv1.CDIUninstallStrategyBlockUninstallIfWorkloadsExist),
				Config:                &cdiv1.CDIConfigSpec{FeatureGates: []string{"HonorWaitForFirstConsumer"}},
				Workloads:             cdiv1.NodePlacement{NodeSelector: map[string]string{"kubernetes.io/os": "linux"}},
			},
		},
	}
	for _, obj := range objects {
		if err := k8sClient.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
		}
		t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), obj) })
		got := obj.DeepCopyObject().(client.Object)
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
			t.Fatalf("reading back %T %s: %v", obj, obj.GetName(), err)
		}
		if specOf(t, got) == nil || !reflect.DeepEqual(specOf(t, got), specOf(t, obj)) {
			t.Errorf("%T %s: spec read back\n%v\nwant\n%v", obj, obj.GetName(), specOf(t, got), specOf(t, obj))
		}
	}

	// The singleton CDIConfig is named "config"; the API refuses any other name.
	config := &cdiv1.CDIConfig{
		ObjectMeta: metav1.ObjectMeta{Name: cdiv1.CDIConfigName},
		Spec: cdiv1.CDIConfigSpec{
			UploadProxyURLOverride: ptr.To("https://upload.example.test"),
			FilesystemOverhead:     &cdiv1.FilesystemOverhead{Global: "0.055", StorageClass: map[string]cdiv1.Percent{"hostpath": "0.1"}},
			ImportProxy:            &cdiv1.ImportProxy{HTTPProxy: ptr.To("http://proxy.test:3128"), NoProxy: ptr.To(".cluster.local")},
		},
	}
	if err := k8sClient.Create(ctx, config); err != nil {
		t.Fatalf("creating CDIConfig: %v", err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), config) })
	wrong := &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: "not-config"}}
	err := k8sClient.Create(ctx, wrong)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "the CDIConfig must be named config") {
		t.Errorf("creating a CDIConfig named not-config: got %v, want an Invalid error naming the rule", err)
	}
	// ImportProxy's capitalised keys are CDI's wire format.
	raw := getUnstructured(t, cdiGVR("cdiconfigs"), "", cdiv1.CDIConfigName)
	if v, _, _ := unstructured.NestedString(raw.Object, "spec", "importProxy", "HTTPProxy"); v != "http://proxy.test:3128" {
		t.Errorf("spec.importProxy.HTTPProxy on the wire = %q", v)
	}
}

// TestDataVolumeStatusSubresource checks that status is written only through
// the status subresource, as a controller does.
func TestDataVolumeStatusSubresource(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	dv := &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "status", Namespace: ns},
		Spec: cdiv1.DataVolumeSpec{
			Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}},
			PVC: &corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		},
	}
	if err := k8sClient.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	dv.Status = cdiv1.DataVolumeStatus{
		Phase: cdiv1.ImportInProgress, Progress: "45.20%", RestartCount: 2, ClaimName: "status",
		Conditions: []cdiv1.DataVolumeCondition{{Type: cdiv1.DataVolumeRunning, Status: corev1.ConditionTrue, Reason: cdiv1.ReasonTransferRunning}},
	}
	if err := k8sClient.Status().Update(ctx, dv); err != nil {
		t.Fatalf("updating status: %v", err)
	}
	got := &cdiv1.DataVolume{}
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dv), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != cdiv1.ImportInProgress || got.Status.Progress != "45.20%" || got.Status.RestartCount != 2 ||
		len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Reason != cdiv1.ReasonTransferRunning {
		t.Errorf("status read back = %+v", got.Status)
	}
	// A plain update must not change status: it belongs to the subresource.
	got.Status.Phase = cdiv1.Succeeded
	got.Labels = map[string]string{"touched": "yes"}
	if err := k8sClient.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	again := &cdiv1.DataVolume{}
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dv), again); err != nil {
		t.Fatal(err)
	}
	if again.Status.Phase != cdiv1.ImportInProgress || again.Labels["touched"] != "yes" {
		t.Errorf("after a plain update: phase %q labels %v; want phase unchanged and the label set", again.Status.Phase, again.Labels)
	}
}

// TestDataVolumeShapesRoundTrip creates DataVolumes written in CDI's
// documented YAML shapes, reads them back from the real apiserver, and checks
// every field survives: both on the wire and through our Go types.
func TestDataVolumeShapesRoundTrip(t *testing.T) {
	ns := newNamespace(t)
	files, err := filepath.Glob(filepath.Join("testdata", "datavolumes", "*.yaml"))
	if err != nil || len(files) < 6 {
		t.Fatalf("want the CDI-shaped fixtures under testdata/datavolumes, found %d (%v)", len(files), err)
	}
	dyn := dynamic.NewForConfigOrDie(cfg)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			obj := readUnstructured(t, file)
			obj.SetNamespace(ns)
			created, err := dyn.Resource(cdiGVR("datavolumes")).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("the apiserver refused a CDI-shaped DataVolume: %v", err)
			}
			back := getUnstructured(t, cdiGVR("datavolumes"), ns, created.GetName())
			if !reflect.DeepEqual(back.Object["spec"], obj.Object["spec"]) {
				t.Errorf("spec changed on the wire:\nsent %v\ngot  %v", obj.Object["spec"], back.Object["spec"])
			}
			if !reflect.DeepEqual(back.GetAnnotations(), obj.GetAnnotations()) {
				t.Errorf("annotations changed: sent %v got %v", obj.GetAnnotations(), back.GetAnnotations())
			}

			// Through the Go types and back to JSON, nothing may be lost.
			var typed cdiv1.DataVolume
			if err := runtimeConvert(back.Object, &typed); err != nil {
				t.Fatalf("decoding into cdiv1.DataVolume: %v", err)
			}
			var again map[string]any
			if err := runtimeConvert(&typed, &again); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(pruneEmpty(again["spec"]), pruneEmpty(obj.Object["spec"])) {
				t.Errorf("spec changed through the Go types:\nsent %v\ngot  %v", obj.Object["spec"], again["spec"])
			}
		})
	}
}

// TestMalformedDataVolumesRejected sends DataVolumes that break the API's
// rules and checks each is refused at admission with the message named in
// the fixture's "# want:" line.
func TestMalformedDataVolumesRejected(t *testing.T) {
	ns := newNamespace(t)
	files, err := filepath.Glob(filepath.Join("testdata", "invalid", "*.yaml"))
	if err != nil || len(files) < 8 {
		t.Fatalf("want the malformed fixtures under testdata/invalid, found %d (%v)", len(files), err)
	}
	dyn := dynamic.NewForConfigOrDie(cfg)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			want := wantLine(t, file)
			obj := readUnstructured(t, file)
			obj.SetNamespace(ns)
			_, err := dyn.Resource(cdiGVR("datavolumes")).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{})
			if err == nil {
				t.Fatalf("the apiserver accepted a malformed DataVolume; want an error containing %q", want)
			}
			if !apierrors.IsInvalid(err) {
				t.Errorf("got %v, want an Invalid (422) error", err)
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err.Error(), want)
			}
			t.Logf("refused: %v", err)
		})
	}
}

func readUnstructured(t *testing.T, file string) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &obj.Object); err != nil {
		t.Fatalf("parsing %s: %v", file, err)
	}
	return obj
}

// wantLine returns the text after "# want:" in a fixture's first lines.
func wantLine(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "# want:"); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("%s has no '# want:' line", file)
	return ""
}

func getUnstructured(t *testing.T, gvr schema.GroupVersionResource, ns, name string) *unstructured.Unstructured {
	t.Helper()
	obj, err := dynamic.NewForConfigOrDie(cfg).Resource(gvr).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading %s %s/%s: %v", gvr.Resource, ns, name, err)
	}
	return obj
}

// specOf returns an object's spec as generic JSON data.
func specOf(t *testing.T, obj client.Object) any {
	t.Helper()
	var m map[string]any
	if err := runtimeConvert(obj, &m); err != nil {
		t.Fatal(err)
	}
	return m["spec"]
}

// runtimeConvert copies in to out through JSON, as the wire does.
func runtimeConvert(in, out any) error {
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, out)
}

// pruneEmpty drops empty objects, so that a struct field Go always writes
// (such as storage.resources) compares equal to its absence.
func pruneEmpty(v any) any {
	m, ok := v.(map[string]any)
	if !ok {
		if l, ok := v.([]any); ok {
			for i := range l {
				l[i] = pruneEmpty(l[i])
			}
		}
		return v
	}
	out := map[string]any{}
	for k, val := range m {
		val = pruneEmpty(val)
		if sub, ok := val.(map[string]any); ok && len(sub) == 0 && k != "blank" && k != "upload" {
			continue
		}
		out[k] = val
	}
	return out
}
