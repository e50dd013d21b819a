package uploadcli

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func valid() Options {
	return Options{Kind: KindDataVolume, Name: "disk", Namespace: "vms", ImagePath: "disk.qcow2", Size: "10Gi", WaitSecs: 300, Retry: 5}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Options)
		wantErr string
	}{
		{"valid image", func(*Options) {}, ""},
		{"valid archive", func(o *Options) { o.ImagePath, o.ArchivePath = "", "data.tar" }, ""},
		{"valid pvc with everything", func(o *Options) {
			o.Kind, o.StorageClass, o.AccessMode, o.VolumeMode, o.ForceBind, o.ProxyURL, o.CACert = KindPVC, "local", "readwritemany", "Block", true, "upload.example:31001", "ca.crt"
		}, ""},
		{"no-create without size", func(o *Options) { o.NoCreate, o.Size = true, "" }, ""},
		{"no file", func(o *Options) { o.ImagePath = "" }, "--image-path (a disk image) or --archive-path"},
		{"both files", func(o *Options) { o.ArchivePath = "x.tar" }, "exclude each other"},
		{"no size", func(o *Options) { o.Size = "" }, "--size is required"},
		{"bad size", func(o *Options) { o.Size = "ten gigs" }, "not a quantity"},
		{"zero size", func(o *Options) { o.Size = "0" }, "must be positive"},
		{"no-create with size", func(o *Options) { o.NoCreate = true }, "do not go with --no-create"},
		{"no-create with force-bind", func(o *Options) { o.NoCreate, o.Size, o.ForceBind = true, "", true }, "do not go with --no-create"},
		{"bad access mode", func(o *Options) { o.AccessMode = "RWO" }, "--access-mode \"RWO\""},
		{"bad volume mode", func(o *Options) { o.VolumeMode = "raw" }, "--volume-mode \"raw\""},
		{"archive on block", func(o *Options) { o.ImagePath, o.ArchivePath, o.VolumeMode = "", "d.tar", "block" }, "needs a Filesystem volume"},
		{"http proxy", func(o *Options) { o.ProxyURL = "http://upload.example" }, "must be https"},
		{"insecure with CA", func(o *Options) { o.Insecure, o.CACert = true, "ca.crt" }, "--insecure and --ca-cert"},
		{"negative wait", func(o *Options) { o.WaitSecs = -1 }, "--wait-secs"},
		{"negative retry", func(o *Options) { o.Retry = -2 }, "--retry"},
		{"bad kind", func(o *Options) { o.Kind = "vm" }, "kind must be"},
		{"no name", func(o *Options) { o.Name = "" }, "name of the DataVolume or PVC"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := valid()
			tc.mutate(&o)
			err := o.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestNormalizeKind(t *testing.T) {
	for in, want := range map[string]string{"dv": KindDataVolume, "DataVolume": KindDataVolume, "pvc": KindPVC, "PersistentVolumeClaim": KindPVC} {
		if got, err := NormalizeKind(in); err != nil || got != want {
			t.Errorf("NormalizeKind(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := NormalizeKind("vmi"); err == nil {
		t.Error("NormalizeKind(vmi) accepted")
	}
}

func TestProxyURL(t *testing.T) {
	s := func(v string) *string { return &v }
	tests := []struct {
		name    string
		cfg     *cdiv1.CDIConfig
		want    string
		wantErr bool
	}{
		{"nothing published", &cdiv1.CDIConfig{}, "", true},
		{"no config", nil, "", true},
		{"status", &cdiv1.CDIConfig{Status: cdiv1.CDIConfigStatus{UploadProxyURL: s("upload.example:31001")}}, "https://upload.example:31001", false},
		{"override wins", &cdiv1.CDIConfig{Spec: cdiv1.CDIConfigSpec{UploadProxyURLOverride: s("https://override.example/")}, Status: cdiv1.CDIConfigStatus{UploadProxyURL: s("upload.example")}}, "https://override.example", false},
		{"empty override ignored", &cdiv1.CDIConfig{Spec: cdiv1.CDIConfigSpec{UploadProxyURLOverride: s("")}, Status: cdiv1.CDIConfigStatus{UploadProxyURL: s("https://upload.example")}}, "https://upload.example", false},
	}
	for _, tc := range tests {
		got, err := ProxyURLFromConfig(tc.cfg)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("%s: got %q, %v; want %q (error %v)", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestUploadPath(t *testing.T) {
	if UploadPath(false, true) != "/v1beta1/upload-async" || UploadPath(false, false) != "/v1beta1/upload" || UploadPath(true, true) != "/v1beta1/upload-archive" {
		t.Error("UploadPath picks the wrong path")
	}
}

func TestObjects(t *testing.T) {
	o := valid()
	o.StorageClass, o.AccessMode, o.VolumeMode, o.ForceBind = "local", "ReadWriteOnce", "block", true
	dv, err := o.DataVolume()
	if err != nil {
		t.Fatal(err)
	}
	if dv.Spec.Source == nil || dv.Spec.Source.Upload == nil || dv.Spec.Storage == nil || dv.Spec.PVC != nil {
		t.Fatalf("DataVolume spec %+v: want source.upload and storage", dv.Spec)
	}
	st := dv.Spec.Storage
	if q := st.Resources.Requests[corev1.ResourceStorage]; q.String() != "10Gi" || *st.StorageClassName != "local" || *st.VolumeMode != corev1.PersistentVolumeBlock || st.AccessModes[0] != corev1.ReadWriteOnce {
		t.Errorf("storage %+v", st)
	}
	if dv.Annotations[cdiv1.AnnImmediateBinding] != "true" || dv.Spec.ContentType != "" {
		t.Errorf("annotations %v, content type %q", dv.Annotations, dv.Spec.ContentType)
	}

	a := valid()
	a.Kind, a.ImagePath, a.ArchivePath = KindPVC, "", "data.tar"
	pvc, src, err := a.PVC()
	if err != nil {
		t.Fatal(err)
	}
	ref := pvc.Spec.DataSourceRef
	if ref == nil || *ref.APIGroup != cdiv1.GroupName || ref.Kind != cdiv1.VolumeUploadSourceRef || ref.Name != src.Name || src.Namespace != "vms" {
		t.Errorf("PVC dataSourceRef %+v, source %s/%s", ref, src.Namespace, src.Name)
	}
	if src.Spec.ContentType != cdiv1.DataVolumeArchive || pvc.Spec.AccessModes[0] != corev1.ReadWriteOnce || pvc.Annotations != nil {
		t.Errorf("archive PVC: source %+v, access modes %v, annotations %v", src.Spec, pvc.Spec.AccessModes, pvc.Annotations)
	}
	adv, _ := a.DataVolume()
	if adv.Spec.ContentType != cdiv1.DataVolumeArchive {
		t.Errorf("archive DataVolume content type %q", adv.Spec.ContentType)
	}
}

func TestDone(t *testing.T) {
	dv := &cdiv1.DataVolume{}
	dv.Status.Phase = cdiv1.UploadReady
	if done, what, err := DataVolumeDone(dv); done || err != nil || !strings.Contains(what, "UploadReady") {
		t.Errorf("UploadReady: %v %q %v", done, what, err)
	}
	dv.Status.Phase = cdiv1.Succeeded
	if done, _, err := DataVolumeDone(dv); !done || err != nil {
		t.Errorf("Succeeded: %v %v", done, err)
	}
	dv.Status.Phase = cdiv1.Failed
	if _, _, err := DataVolumeDone(dv); err == nil {
		t.Error("Failed is not an error")
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if PVCDone(pvc) {
		t.Error("an empty claim is done")
	}
	pvc.Annotations = map[string]string{cdiv1.AnnPodPhase: "Succeeded"}
	if !PVCDone(pvc) {
		t.Error("a claim whose pod succeeded is not done")
	}
}

func TestSpinnerOffTerminalPrintsEachStateOnce(t *testing.T) {
	var out strings.Builder
	s := NewSpinner(&out, "waiting for the upload pod")
	s.Describe("waiting for the upload pod")
	s.Describe("the upload pod is not ready yet")
	s.Describe("the upload pod is not ready yet")
	s.Stop()
	if got, want := out.String(), "waiting for the upload pod\nthe upload pod is not ready yet\n"; got != want {
		t.Errorf("spinner output %q, want %q", got, want)
	}
}
