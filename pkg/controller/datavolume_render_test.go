package controller

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/populators"
)

func storageDV(st cdiv1.StorageSpec) *cdiv1.DataVolume {
	return &cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{
		Source:  &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://x"}},
		Storage: &st,
	}}
}

func requests(size string) corev1.VolumeResourceRequirements {
	return corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}
}

func profile(sets ...cdiv1.ClaimPropertySet) *cdiv1.StorageProfile {
	return &cdiv1.StorageProfile{Status: cdiv1.StorageProfileStatus{ClaimPropertySets: sets}}
}

func set(mode corev1.PersistentVolumeMode, modes ...corev1.PersistentVolumeAccessMode) cdiv1.ClaimPropertySet {
	return cdiv1.ClaimPropertySet{AccessModes: modes, VolumeMode: &mode}
}

func TestRenderClaimSpec(t *testing.T) {
	block, fs := corev1.PersistentVolumeBlock, corev1.PersistentVolumeFilesystem
	rwx, rwo := corev1.ReadWriteMany, corev1.ReadWriteOnce
	rbdLike := profile(set(block, rwx), set(fs, rwo))
	cases := []struct {
		name      string
		dv        *cdiv1.DataVolume
		profile   *cdiv1.StorageProfile
		overhead  float64
		wantModes []corev1.PersistentVolumeAccessMode
		wantMode  corev1.PersistentVolumeMode
		wantSize  string
		wantErr   string
	}{
		{name: "pvc is used as written", dv: &cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{PVC: &corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{rwo}, VolumeMode: &fs, Resources: requests("1Gi")}}},
			overhead: 0.5, wantModes: []corev1.PersistentVolumeAccessMode{rwo}, wantMode: fs, wantSize: "1Gi"},
		{name: "profile fills modes; block gets no overhead", dv: storageDV(cdiv1.StorageSpec{Resources: requests("10Gi")}), profile: rbdLike,
			overhead: 0.06, wantModes: []corev1.PersistentVolumeAccessMode{rwx}, wantMode: block, wantSize: "10Gi"},
		{name: "volume mode picks the matching set; filesystem grows by overhead", dv: storageDV(cdiv1.StorageSpec{VolumeMode: &fs, Resources: requests("1Gi")}), profile: rbdLike,
			overhead: 0.06, wantModes: []corev1.PersistentVolumeAccessMode{rwo}, wantMode: fs, wantSize: "1090Mi"},
		{name: "FromStorageProfile volume mode", dv: storageDV(cdiv1.StorageSpec{VolumeMode: ptr.To(cdiv1.PersistentVolumeFromStorageProfile), Resources: requests("1Gi")}), profile: rbdLike,
			overhead: 0.06, wantModes: []corev1.PersistentVolumeAccessMode{rwx}, wantMode: block, wantSize: "1Gi"},
		{name: "user's modes win", dv: storageDV(cdiv1.StorageSpec{AccessModes: []corev1.PersistentVolumeAccessMode{rwo}, VolumeMode: &block, Resources: requests("1Gi")}),
			wantModes: []corev1.PersistentVolumeAccessMode{rwo}, wantMode: block, wantSize: "1Gi"},
		{name: "no profile, no modes", dv: storageDV(cdiv1.StorageSpec{Resources: requests("1Gi")}), wantErr: "has no claimPropertySets"},
		{name: "no set for the mode", dv: storageDV(cdiv1.StorageSpec{VolumeMode: &block, Resources: requests("1Gi")}), profile: profile(set(fs, rwo)), wantErr: "no claimPropertySet for volumeMode Block"},
		{name: "no size", dv: storageDV(cdiv1.StorageSpec{AccessModes: []corev1.PersistentVolumeAccessMode{rwo}, VolumeMode: &fs}), wantErr: "needs a size"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec, err := RenderClaimSpec(c.dv, c.profile, "fast", c.overhead)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(spec.AccessModes) != len(c.wantModes) || spec.AccessModes[0] != c.wantModes[0] || *spec.VolumeMode != c.wantMode {
				t.Errorf("modes %v %v, want %v %v", spec.AccessModes, *spec.VolumeMode, c.wantModes, c.wantMode)
			}
			got := spec.Resources.Requests[corev1.ResourceStorage]
			if want := resource.MustParse(c.wantSize); got.Cmp(want) != 0 {
				t.Errorf("size %s, want %s", got.String(), c.wantSize)
			}
		})
	}
}

func TestWithOverhead(t *testing.T) {
	got := WithOverhead(resource.MustParse("1Gi"), 0.06)
	// 1024 MiB / 0.94 = 1089.4 MiB, rounded up to whole MiB.
	if got.Value() != 1090<<20 {
		t.Errorf("1Gi with 6%% overhead = %d bytes, want %d", got.Value(), int64(1090<<20))
	}
	if q := WithOverhead(resource.MustParse("1Gi"), 0); q.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Errorf("zero overhead changed the size to %s", q.String())
	}
}

func TestImportSourceFor(t *testing.T) {
	dv := &cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{
		Source:        &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://x", Checksum: "sha256:00"}},
		ContentType:   cdiv1.DataVolumeArchive,
		Preallocation: ptr.To(true),
	}}
	spec := ImportSourceFor(dv)
	if spec.Source.HTTP.URL != "http://x" || spec.Source.HTTP.Checksum != "sha256:00" || spec.ContentType != cdiv1.DataVolumeArchive || !*spec.Preallocation {
		t.Errorf("import source %+v", spec)
	}
	spec.Source.HTTP.URL = "changed"
	if dv.Spec.Source.HTTP.URL != "http://x" {
		t.Error("the rendered source shares memory with the DataVolume")
	}
	if !IsImport(dv) || IsImport(&cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}}}) {
		t.Error("IsImport misjudges http or upload")
	}
}

func TestUploadSource(t *testing.T) {
	dv := &cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{
		Source:      &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}},
		ContentType: cdiv1.DataVolumeArchive, Preallocation: ptr.To(true),
	}}
	dv.UID = "u-1"
	if !IsUpload(dv) || IsImport(dv) {
		t.Fatalf("IsUpload %v IsImport %v, want an upload", IsUpload(dv), IsImport(dv))
	}
	spec := UploadSourceFor(dv)
	if spec.ContentType != cdiv1.DataVolumeArchive || spec.Preallocation == nil || !*spec.Preallocation || UploadSourceName(dv) != "volume-upload-source-u-1" {
		t.Errorf("upload source %+v named %s", spec, UploadSourceName(dv))
	}
	if ann := claimAnnotations(dv); ann[cdiv1.AnnImmediateBinding] != "true" || ann[cdiv1.AnnContentType] != "archive" {
		t.Errorf("upload claim annotations %v: want immediate binding and the content type", ann)
	}
	if IsUpload(storageDV(cdiv1.StorageSpec{})) {
		t.Error("an http DataVolume counted as an upload")
	}
}

func TestClaimAnnotationsForWorkerPods(t *testing.T) {
	cases := []struct {
		name string
		dv   map[string]string
		want map[string]string
	}{
		{"networks and mesh choices reach the claim",
			map[string]string{cdiv1.AnnPodNetwork: "net1", cdiv1.AnnPodMultusDefaultNetwork: "ns/def",
				cdiv1.AnnPodSidecarInjectionIstio: "true", cdiv1.AnnPodSidecarInjectionLinkerd: "enabled"},
			map[string]string{cdiv1.AnnPodNetwork: "net1", cdiv1.AnnPodMultusDefaultNetwork: "ns/def",
				cdiv1.AnnPodSidecarInjectionIstio: "true", cdiv1.AnnPodSidecarInjectionLinkerd: "enabled"}},
		// An empty value is copied as given: it leaves the pod without the key.
		{"an empty mesh choice is kept", map[string]string{cdiv1.AnnPodSidecarInjectionIstio: ""},
			map[string]string{cdiv1.AnnPodSidecarInjectionIstio: ""}},
		{"no choice, no annotation: the worker pod gets the default", map[string]string{"team": "a"}, map[string]string{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dv := storageDV(cdiv1.StorageSpec{})
			dv.Annotations = c.dv
			got := claimAnnotations(dv)
			for _, key := range populators.WorkerPodAnnotationKeys {
				want, wantOK := c.want[key]
				if v, ok := got[key]; v != want || ok != wantOK {
					t.Errorf("claim %s = %q (set %v), want %q (set %v)", key, v, ok, want, wantOK)
				}
			}
		})
	}
}
