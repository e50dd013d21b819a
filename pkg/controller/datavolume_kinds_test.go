package controller

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestKindOf(t *testing.T) {
	src := func(s cdiv1.DataVolumeSource) cdiv1.DataVolumeSpec { return cdiv1.DataVolumeSpec{Source: &s} }
	cases := []struct {
		name string
		spec cdiv1.DataVolumeSpec
		want string // "" for no kind
	}{
		{"http", src(cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://x"}}), "import"},
		{"s3", src(cdiv1.DataVolumeSource{S3: &cdiv1.DataVolumeSourceS3{}}), "import"},
		{"gcs", src(cdiv1.DataVolumeSource{GCS: &cdiv1.DataVolumeSourceGCS{}}), "import"},
		{"registry", src(cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To("docker://x")}}), "import"},
		{"blank", src(cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}), "import"},
		{"imageio", src(cdiv1.DataVolumeSource{Imageio: &cdiv1.DataVolumeSourceImageIO{}}), "import"},
		{"vddk", src(cdiv1.DataVolumeSource{VDDK: &cdiv1.DataVolumeSourceVDDK{}}), "import"},
		{"upload", src(cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}), "upload"},
		{"pvc clone", src(cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{}}), "clone"},
		{"snapshot clone", src(cdiv1.DataVolumeSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{}}), "clone"},
		{"sourceRef", cdiv1.DataVolumeSpec{SourceRef: &cdiv1.DataVolumeSourceRef{Kind: "DataSource", Name: "x"}}, "clone"},
		{"sourceRef of another kind", cdiv1.DataVolumeSpec{SourceRef: &cdiv1.DataVolumeSourceRef{Kind: "Other", Name: "x"}}, ""},
		{"no source", cdiv1.DataVolumeSpec{}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dv := &cdiv1.DataVolume{Spec: c.spec}
			got := ""
			if k := kindOf(dv); k != nil {
				got = k.name
			}
			if got != c.want {
				t.Errorf("kindOf = %q, want %q", got, c.want)
			}
			if c.want == "" && reportingKindOf(dv).name != "import" {
				t.Errorf("a DataVolume of no kind reports as %q, want import", reportingKindOf(dv).name)
			}
		})
	}
}

// TestSourceKindRows checks that every row is complete and consistent: its
// source object is of the Kind its dataSourceRef names, and setSpec fills
// that object.
func TestSourceKindRows(t *testing.T) {
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk", UID: "u-1"}}
	seen := map[string]bool{}
	for _, k := range sourceKinds {
		if k.name == "" || k.matches == nil || k.sourceName == nil || k.newSource == nil || k.setSpec == nil || k.doneMessage == "" || k.phase == nil {
			t.Errorf("row %q is incomplete: %+v", k.name, k)
			continue
		}
		if seen[k.ref] {
			t.Errorf("two rows for %s", k.ref)
		}
		seen[k.ref] = true
		obj := k.newSource()
		if got := reflect.TypeOf(obj).Elem().Name(); got != k.ref {
			t.Errorf("row %q: source object %s, dataSourceRef kind %s", k.name, got, k.ref)
		}
		if k.sourceName(dv) == "" {
			t.Errorf("row %q: empty source name", k.name)
		}
	}
}

func TestPhasesWhileRunning(t *testing.T) {
	cases := []struct {
		name     string
		w        workerView
		imp, upl cdiv1.DataVolumePhase
	}{
		{"nothing yet", workerView{}, cdiv1.Pending, cdiv1.Pending},
		{"waits for a consumer", workerView{WaitsForConsumer: true}, cdiv1.PendingPopulation, cdiv1.PendingPopulation},
		{"prime made", workerView{PrimeExists: true, WaitsForConsumer: true}, cdiv1.ImportScheduled, cdiv1.UploadScheduled},
		{"pod pending", workerView{PodPhase: corev1.PodPending, PrimeExists: true}, cdiv1.ImportScheduled, cdiv1.UploadScheduled},
		{"pod running, not ready", workerView{PodPhase: corev1.PodRunning, PrimeExists: true}, cdiv1.ImportInProgress, cdiv1.UploadScheduled},
		{"pod ready", workerView{PodPhase: corev1.PodRunning, PodReady: true, PrimeExists: true}, cdiv1.ImportInProgress, cdiv1.UploadReady},
		{"pod succeeded, rebind pending", workerView{PodPhase: corev1.PodSucceeded, PrimeExists: true}, cdiv1.ImportInProgress, cdiv1.UploadReady},
	}
	for _, c := range cases {
		if got := importPhase(c.w); got != c.imp {
			t.Errorf("%s: importPhase = %s, want %s", c.name, got, c.imp)
		}
		if got := uploadPhase(c.w); got != c.upl {
			t.Errorf("%s: uploadPhase = %s, want %s", c.name, got, c.upl)
		}
	}
}
