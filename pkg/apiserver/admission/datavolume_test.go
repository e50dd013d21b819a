package admission

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/cloneauth"
	"github.com/kubefill/kubefill/pkg/token"
)

func ptr[T any](v T) *T { return &v }

func size(s string) corev1.VolumeResourceRequirements {
	return corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(s)}}
}

func baseSpec(src cdiv1.DataVolumeSource) cdiv1.DataVolumeSpec {
	return cdiv1.DataVolumeSpec{Source: &src, Storage: &cdiv1.StorageSpec{Resources: size("1Gi")}}
}

func TestValidateDataVolumeSpec(t *testing.T) {
	httpSrc := func(h cdiv1.DataVolumeSourceHTTP) cdiv1.DataVolumeSource { return cdiv1.DataVolumeSource{HTTP: &h} }
	reg := func(r cdiv1.DataVolumeSourceRegistry) cdiv1.DataVolumeSource {
		return cdiv1.DataVolumeSource{Registry: &r}
	}
	blank := cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}
	clonePVC := cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "src", Name: "golden"}}
	with := func(s cdiv1.DataVolumeSpec, f func(*cdiv1.DataVolumeSpec)) cdiv1.DataVolumeSpec { f(&s); return s }
	sha := "sha256:" + strings.Repeat("ab", 32)

	cases := []struct {
		name    string
		spec    cdiv1.DataVolumeSpec
		wantErr string // substring of a field path or message; "" = valid
	}{
		{"blank with size", baseSpec(blank), ""},
		{"http with checksum", baseSpec(httpSrc(cdiv1.DataVolumeSourceHTTP{URL: "https://h/d.qcow2", Checksum: sha})), ""},
		{"http bad checksum hex", baseSpec(httpSrc(cdiv1.DataVolumeSourceHTTP{URL: "https://h/d", Checksum: "sha256:zz"})), "spec.source.http.checksum"},
		{"http unknown checksum algo", baseSpec(httpSrc(cdiv1.DataVolumeSourceHTTP{URL: "https://h/d", Checksum: "crc32:abcd"})), "unsupported checksum algorithm"},
		{"http ftp url", baseSpec(httpSrc(cdiv1.DataVolumeSourceHTTP{URL: "ftp://h/d"})), "spec.source.http.url"},
		{"http no host", baseSpec(httpSrc(cdiv1.DataVolumeSourceHTTP{URL: "https:///d"})), "names no host"},
		{"http empty url", baseSpec(httpSrc(cdiv1.DataVolumeSourceHTTP{})), "spec.source.http.url"},
		{"http header without colon", baseSpec(httpSrc(cdiv1.DataVolumeSourceHTTP{URL: "https://h/d", ExtraHeaders: []string{"nocolon"}})), "extraHeaders[0]"},
		{"http bad secret name", baseSpec(httpSrc(cdiv1.DataVolumeSourceHTTP{URL: "https://h/d", SecretRef: "Bad_Name"})), "spec.source.http.secretRef"},
		{"s3 url", baseSpec(cdiv1.DataVolumeSource{S3: &cdiv1.DataVolumeSourceS3{URL: "s3://bucket/key"}}), ""},
		{"gcs wrong scheme", baseSpec(cdiv1.DataVolumeSource{GCS: &cdiv1.DataVolumeSourceGCS{URL: "s3://b/k"}}), "spec.source.gcs.url"},
		{"registry docker", baseSpec(reg(cdiv1.DataVolumeSourceRegistry{URL: ptr("docker://quay.io/x/y:1")})), ""},
		{"registry http scheme", baseSpec(reg(cdiv1.DataVolumeSourceRegistry{URL: ptr("https://quay.io/x")})), "docker:// or oci-archive://"},
		{"registry both url and stream", baseSpec(reg(cdiv1.DataVolumeSourceRegistry{URL: ptr("docker://a/b"), ImageStream: ptr("s"), PullMethod: ptr(cdiv1.RegistryPullNode)})), "exactly one of url or imageStream"},
		{"registry stream by node", baseSpec(reg(cdiv1.DataVolumeSourceRegistry{ImageStream: ptr("s"), PullMethod: ptr(cdiv1.RegistryPullNode)})), ""},
		{"registry stream by pod", baseSpec(reg(cdiv1.DataVolumeSourceRegistry{ImageStream: ptr("s")})), "imageStream works only with pullMethod node"},
		{"registry oci by node", baseSpec(reg(cdiv1.DataVolumeSourceRegistry{URL: ptr("oci-archive:///a.tar"), PullMethod: ptr(cdiv1.RegistryPullNode)})), "cannot be pulled by the node"},
		{"registry unknown pull method", baseSpec(reg(cdiv1.DataVolumeSourceRegistry{URL: ptr("docker://a/b"), PullMethod: ptr(cdiv1.RegistryPullMethod("kubelet"))})), "pullMethod"},
		{"imageio needs diskId and secret", baseSpec(cdiv1.DataVolumeSource{Imageio: &cdiv1.DataVolumeSourceImageIO{URL: "https://engine/api"}}), "spec.source.imageio.diskId"},
		{"vddk needs uuid", baseSpec(cdiv1.DataVolumeSource{VDDK: &cdiv1.DataVolumeSourceVDDK{URL: "https://vc", BackingFile: "[ds] a.vmdk", SecretRef: "s"}}), "spec.source.vddk.uuid"},
		{"two sources", baseSpec(cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}, Upload: &cdiv1.DataVolumeSourceUpload{}}), "exactly one of http"},
		{"no source", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) { s.Source = nil }), "spec.source"},
		{"source and sourceRef", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) {
			s.SourceRef = &cdiv1.DataVolumeSourceRef{Kind: "DataSource", Name: "ds"}
		}), "spec.sourceRef"},
		{"sourceRef of other kind", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) {
			s.Source, s.SourceRef = nil, &cdiv1.DataVolumeSourceRef{Kind: "PersistentVolumeClaim", Name: "x"}
		}), "spec.sourceRef.kind"},
		{"sourceRef without size is fine", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) {
			s.Source, s.SourceRef = nil, &cdiv1.DataVolumeSourceRef{Kind: "DataSource", Name: "fedora"}
			s.Storage.Resources = corev1.VolumeResourceRequirements{}
		}), ""},
		{"pvc and storage", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) {
			s.PVC = &corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, Resources: size("1Gi")}
		}), "spec.pvc"},
		{"neither pvc nor storage", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) { s.Storage = nil }), "spec.storage"},
		{"pvc needs access modes", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) {
			s.Storage, s.PVC = nil, &corev1.PersistentVolumeClaimSpec{Resources: size("1Gi")}
		}), "spec.pvc.accessModes"},
		{"pvc needs size for import", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) {
			s.Storage, s.PVC = nil, &corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}}
		}), "spec.pvc.resources.requests.storage"},
		{"pvc size optional for clone", with(baseSpec(clonePVC), func(s *cdiv1.DataVolumeSpec) {
			s.Storage, s.PVC = nil, &corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}}
		}), ""},
		{"pvc FromStorageProfile mode", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) {
			s.Storage, s.PVC = nil, &corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, Resources: size("1Gi"), VolumeMode: ptr(cdiv1.PersistentVolumeFromStorageProfile)}
		}), "spec.pvc.volumeMode"},
		{"storage FromStorageProfile mode", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) { s.Storage.VolumeMode = ptr(cdiv1.PersistentVolumeFromStorageProfile) }), ""},
		{"storage bad access mode", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) {
			s.Storage.AccessModes = []corev1.PersistentVolumeAccessMode{"ReadWriteSometimes"}
		}), "spec.storage.accessModes[0]"},
		{"zero size", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) { s.Storage.Resources = size("0") }), "greater than zero"},
		{"storage without size for import", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) { s.Storage.Resources = corev1.VolumeResourceRequirements{} }), "spec.storage.resources.requests.storage"},
		{"storage dataSourceRef forbidden", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) {
			s.Storage.DataSourceRef = &corev1.TypedObjectReference{Kind: "X", Name: "y"}
		}), "spec.storage.dataSourceRef"},
		{"archive with http", with(baseSpec(httpSrc(cdiv1.DataVolumeSourceHTTP{URL: "https://h/a.tar"})), func(s *cdiv1.DataVolumeSpec) { s.ContentType = cdiv1.DataVolumeArchive }), ""},
		{"archive with registry", with(baseSpec(reg(cdiv1.DataVolumeSourceRegistry{URL: ptr("docker://a/b")})), func(s *cdiv1.DataVolumeSpec) { s.ContentType = cdiv1.DataVolumeArchive }), "spec.contentType"},
		{"archive on block", with(baseSpec(cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}), func(s *cdiv1.DataVolumeSpec) {
			s.ContentType = cdiv1.DataVolumeArchive
			s.Storage.VolumeMode = ptr(corev1.PersistentVolumeBlock)
		}), "Filesystem"},
		{"unknown content type", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) { s.ContentType = "iso" }), "spec.contentType"},
		{"checkpoints on http", with(baseSpec(httpSrc(cdiv1.DataVolumeSourceHTTP{URL: "https://h/d"})), func(s *cdiv1.DataVolumeSpec) {
			s.Checkpoints = []cdiv1.DataVolumeCheckpoint{{Current: "a"}}
		}), "spec.checkpoints"},
		{"clone snapshot needs name", baseSpec(cdiv1.DataVolumeSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: "x"}}), "spec.source.snapshot.name"},
		{"clone bad namespace", baseSpec(cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "Not_A_NS", Name: "a"}}), "spec.source.pvc.namespace"},
		{"bad priority class", with(baseSpec(blank), func(s *cdiv1.DataVolumeSpec) { s.PriorityClassName = "UPPER" }), "spec.priorityClassName"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := ValidateDataVolumeSpec(&tc.spec, field.NewPath("spec"))
			if tc.wantErr == "" {
				if len(errs) > 0 {
					t.Fatalf("want valid, got %v", errs.ToAggregate())
				}
				return
			}
			if len(errs) == 0 {
				t.Fatalf("want an error mentioning %q, got none", tc.wantErr)
			}
			if msg := errs.ToAggregate().Error(); !strings.Contains(msg, tc.wantErr) {
				t.Fatalf("error %q does not mention %q", msg, tc.wantErr)
			}
		})
	}
}

func TestValidateDataVolumeUpdate(t *testing.T) {
	vddk := &cdiv1.DataVolume{Spec: baseSpec(cdiv1.DataVolumeSource{VDDK: &cdiv1.DataVolumeSourceVDDK{URL: "https://vc", UUID: "u", BackingFile: "b", SecretRef: "s"}})}
	vddk.Spec.Checkpoints = []cdiv1.DataVolumeCheckpoint{{Current: "snap-1"}}
	next := vddk.DeepCopy()
	next.Spec.Checkpoints = append(next.Spec.Checkpoints, cdiv1.DataVolumeCheckpoint{Previous: "snap-1", Current: "snap-2"})
	next.Spec.FinalCheckpoint = true
	if errs := ValidateDataVolumeUpdate(next, vddk); len(errs) > 0 {
		t.Fatalf("multi-stage checkpoint update refused: %v", errs)
	}
	grown := next.DeepCopy()
	grown.Spec.Storage.Resources = size("2Gi")
	if errs := ValidateDataVolumeUpdate(grown, vddk); len(errs) == 0 {
		t.Fatal("size change during a multi-stage import allowed")
	}
	plain := &cdiv1.DataVolume{Spec: baseSpec(cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}})}
	same := plain.DeepCopy()
	same.Labels = map[string]string{"a": "b"}
	if errs := ValidateDataVolumeUpdate(same, plain); len(errs) > 0 {
		t.Fatalf("metadata-only update refused: %v", errs)
	}
	changed := plain.DeepCopy()
	changed.Spec.PriorityClassName = "high"
	if errs := ValidateDataVolumeUpdate(changed, plain); len(errs) == 0 {
		t.Fatal("spec change allowed")
	}
}

func TestResolveCloneSource(t *testing.T) {
	store := map[string]*cdiv1.DataSource{
		"golden/fedora":  {ObjectMeta: metav1.ObjectMeta{Namespace: "golden", Name: "fedora"}, Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Name: "fedora-42"}}}},
		"golden/latest":  {ObjectMeta: metav1.ObjectMeta{Namespace: "golden", Name: "latest"}, Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{DataSource: &cdiv1.DataSourceRefSourceDataSource{Name: "fedora"}}}},
		"golden/snap":    {ObjectMeta: metav1.ObjectMeta{Namespace: "golden", Name: "snap"}, Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: "snaps", Name: "s1"}}}},
		"golden/loop":    {ObjectMeta: metav1.ObjectMeta{Namespace: "golden", Name: "loop"}, Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{DataSource: &cdiv1.DataSourceRefSourceDataSource{Name: "latest"}}}},
		"team/localonly": {ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "localonly"}, Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Name: "p"}}}},
	}
	get := func(_ context.Context, ns, name string) (*cdiv1.DataSource, error) {
		if ds, ok := store[ns+"/"+name]; ok {
			return ds, nil
		}
		return nil, errors.New("not found")
	}
	dv := func(spec cdiv1.DataVolumeSpec) *cdiv1.DataVolume {
		return &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "vm-disk"}, Spec: spec}
	}
	ref := func(ns *string, name string) cdiv1.DataVolumeSpec {
		return cdiv1.DataVolumeSpec{SourceRef: &cdiv1.DataVolumeSourceRef{Kind: "DataSource", Namespace: ns, Name: name}}
	}
	cases := []struct {
		name    string
		dv      *cdiv1.DataVolume
		want    *cloneauth.Source
		wantErr bool
	}{
		{"pvc in same namespace by default", dv(baseSpec(cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Name: "p"}})), &cloneauth.Source{Resource: token.ResourcePVC, Namespace: "team", Name: "p"}, false},
		{"pvc elsewhere", dv(baseSpec(cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "golden", Name: "p"}})), &cloneauth.Source{Resource: token.ResourcePVC, Namespace: "golden", Name: "p"}, false},
		{"snapshot", dv(baseSpec(cdiv1.DataVolumeSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: "snaps", Name: "s"}})), &cloneauth.Source{Resource: token.ResourceVolumeSnapshot, Namespace: "snaps", Name: "s"}, false},
		{"not a clone", dv(baseSpec(cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}})), nil, false},
		{"sourceRef to pvc, namespace defaults to the DataSource's", dv(ref(ptr("golden"), "fedora")), &cloneauth.Source{Resource: token.ResourcePVC, Namespace: "golden", Name: "fedora-42"}, false},
		{"sourceRef without namespace uses the DataVolume's", dv(ref(nil, "localonly")), &cloneauth.Source{Resource: token.ResourcePVC, Namespace: "team", Name: "p"}, false},
		{"sourceRef through one DataSource", dv(ref(ptr("golden"), "latest")), &cloneauth.Source{Resource: token.ResourcePVC, Namespace: "golden", Name: "fedora-42"}, false},
		{"sourceRef to snapshot", dv(ref(ptr("golden"), "snap")), &cloneauth.Source{Resource: token.ResourceVolumeSnapshot, Namespace: "snaps", Name: "s1"}, false},
		{"sourceRef two levels deep", dv(ref(ptr("golden"), "loop")), nil, true},
		{"sourceRef missing", dv(ref(ptr("golden"), "nope")), nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveCloneSource(context.Background(), tc.dv, get)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tc.wantErr)
			}
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestAnnotationPatch(t *testing.T) {
	ops := setAnnotationPatch(nil, cdiv1.AnnCloneToken, "t")
	if ops[0].Path != "/metadata/annotations" {
		t.Fatalf("nil annotations: %+v", ops)
	}
	ops = setAnnotationPatch(map[string]string{"a": "b"}, cdiv1.AnnCloneToken, "t")
	if ops[0].Path != "/metadata/annotations/cdi.kubevirt.io~1storage.clone.token" || ops[0].Op != "add" {
		t.Fatalf("escaped path: %+v", ops)
	}
	if escapePointer("a~b/c") != "a~0b~1c" {
		t.Fatal("JSON pointer escaping")
	}
}

func review(kind string, op admissionv1.Operation, obj, old any) *admissionv1.AdmissionRequest {
	raw := func(v any) runtime.RawExtension {
		if v == nil {
			return runtime.RawExtension{}
		}
		data, _ := json.Marshal(v)
		return runtime.RawExtension{Raw: data}
	}
	return &admissionv1.AdmissionRequest{
		Kind:      metav1.GroupVersionKind{Group: cdiv1.GroupName, Version: "v1beta1", Kind: kind},
		Operation: op, Namespace: "team", Name: "x", Object: raw(obj), OldObject: raw(old),
	}
}

func TestDataVolumeValidatorAdmit(t *testing.T) {
	v := &DataVolumeValidator{}
	good := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "disk"}, Spec: baseSpec(cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}})}
	if r := v.Admit(context.Background(), review("DataVolume", admissionv1.Create, good, nil)); !r.Allowed {
		t.Fatalf("good DataVolume denied: %+v", r.Result)
	}
	bad := good.DeepCopy()
	bad.Spec.Storage.Resources = size("0")
	r := v.Admit(context.Background(), review("DataVolume", admissionv1.Create, bad, nil))
	if r.Allowed || r.Result.Code != 422 || r.Result.Reason != metav1.StatusReasonInvalid || len(r.Result.Details.Causes) != 1 ||
		r.Result.Details.Causes[0].Field != "spec.storage.resources.requests.storage" {
		t.Fatalf("bad DataVolume: %+v", r.Result)
	}
	long := good.DeepCopy()
	long.Name = strings.Repeat("a", 64)
	if r := v.Admit(context.Background(), review("DataVolume", admissionv1.Create, long, nil)); r.Allowed {
		t.Fatal("64-character name allowed")
	}
	// A size that does not parse as a quantity fails decoding with a clear message.
	req := review("DataVolume", admissionv1.Create, nil, nil)
	req.Object.Raw = []byte(`{"metadata":{"name":"d"},"spec":{"source":{"blank":{}},"storage":{"resources":{"requests":{"storage":"ten gigs"}}}}}`)
	if r := v.Admit(context.Background(), req); r.Allowed || !strings.Contains(r.Result.Message, "quantity") {
		t.Fatalf("unparsable size: %+v", r.Result)
	}
	if r := v.Admit(context.Background(), review("DataSource", admissionv1.Create, good, nil)); r.Allowed {
		t.Fatal("wrong kind allowed")
	}
}

func TestPopulatorValidation(t *testing.T) {
	snapGroup := "snapshot.storage.k8s.io"
	cases := []struct {
		name string
		kind string
		obj  any
		ok   bool
	}{
		{"import http", "VolumeImportSource", cdiv1.VolumeImportSource{Spec: cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://h/d"}}}}, true},
		{"import no source", "VolumeImportSource", cdiv1.VolumeImportSource{}, false},
		{"import two sources", "VolumeImportSource", cdiv1.VolumeImportSource{Spec: cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{Blank: &cdiv1.DataVolumeBlankImage{}, HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://h/d"}}}}, false},
		{"import archive from registry", "VolumeImportSource", cdiv1.VolumeImportSource{Spec: cdiv1.VolumeImportSourceSpec{ContentType: cdiv1.DataVolumeArchive, Source: &cdiv1.ImportSourceType{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr("docker://a/b")}}}}, false},
		{"upload kubevirt", "VolumeUploadSource", cdiv1.VolumeUploadSource{Spec: cdiv1.VolumeUploadSourceSpec{ContentType: cdiv1.DataVolumeKubeVirt}}, true},
		{"upload bad content type", "VolumeUploadSource", cdiv1.VolumeUploadSource{Spec: cdiv1.VolumeUploadSourceSpec{ContentType: "iso"}}, false},
		{"clone pvc", "VolumeCloneSource", cdiv1.VolumeCloneSource{Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "p"}}}, true},
		{"clone snapshot", "VolumeCloneSource", cdiv1.VolumeCloneSource{Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{APIGroup: &snapGroup, Kind: "VolumeSnapshot", Name: "s"}}}, true},
		{"clone snapshot without group", "VolumeCloneSource", cdiv1.VolumeCloneSource{Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "VolumeSnapshot", Name: "s"}}}, false},
		{"clone without name", "VolumeCloneSource", cdiv1.VolumeCloneSource{Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim"}}}, false},
		{"unknown kind", "DataVolume", cdiv1.VolumeUploadSource{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := AdmitPopulator(context.Background(), review(tc.kind, admissionv1.Create, tc.obj, nil))
			if r.Allowed != tc.ok {
				t.Fatalf("allowed=%v, want %v: %+v", r.Allowed, tc.ok, r.Result)
			}
		})
	}
	old := cdiv1.VolumeUploadSource{Spec: cdiv1.VolumeUploadSourceSpec{ContentType: cdiv1.DataVolumeKubeVirt}}
	changed := cdiv1.VolumeUploadSource{Spec: cdiv1.VolumeUploadSourceSpec{ContentType: cdiv1.DataVolumeArchive}}
	if r := AdmitPopulator(context.Background(), review("VolumeUploadSource", admissionv1.Update, changed, old)); r.Allowed {
		t.Fatal("spec change of a populator source allowed")
	}
	if r := AdmitPopulator(context.Background(), review("VolumeUploadSource", admissionv1.Update, old, old)); !r.Allowed {
		t.Fatal("unchanged update denied")
	}
}

func TestValidateChecksum(t *testing.T) {
	for sum, ok := range map[string]bool{
		"md5:" + strings.Repeat("0", 32):     true,
		"sha1:" + strings.Repeat("f", 40):    true,
		"SHA256:" + strings.Repeat("A", 64):  true,
		"sha512:" + strings.Repeat("1", 128): true,
		"sha256:" + strings.Repeat("1", 63):  false,
		"sha256":                             false,
		"blake3:" + strings.Repeat("1", 64):  false,
	} {
		if err := ValidateChecksum(sum); (err == nil) != ok {
			t.Errorf("ValidateChecksum(%q) = %v, want ok=%v", sum, err, ok)
		}
	}
}

// Paths of the mutating webhook that need no API calls.
func TestDataVolumeMutatorWithoutClone(t *testing.T) {
	m := &DataVolumeMutator{}
	plain := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "d"}, Spec: baseSpec(cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}})}
	if r := m.Admit(context.Background(), review("DataVolume", admissionv1.Create, plain, nil)); !r.Allowed || r.Patch != nil {
		t.Fatalf("non-clone: %+v", r)
	}
	stray := plain.DeepCopy()
	stray.Annotations = map[string]string{cdiv1.AnnCloneToken: "copied-from-elsewhere"}
	r := m.Admit(context.Background(), review("DataVolume", admissionv1.Create, stray, nil))
	if !r.Allowed || string(r.Patch) != `[{"op":"remove","path":"/metadata/annotations/cdi.kubevirt.io~1storage.clone.token"}]` {
		t.Fatalf("stray token on a non-clone: %+v %s", r, r.Patch)
	}
	gen := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", GenerateName: "clone-"}, Spec: baseSpec(cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "src", Name: "p"}})}
	req := review("DataVolume", admissionv1.Create, gen, nil)
	req.Name = ""
	if r := m.Admit(context.Background(), req); r.Allowed || !strings.Contains(r.Result.Message, "generateName") {
		t.Fatalf("generateName clone: %+v", r.Result)
	}
	if r := m.Admit(context.Background(), review("DataVolume", admissionv1.Update, plain, plain)); !r.Allowed || r.Patch != nil {
		t.Fatalf("update: %+v", r)
	}
}
