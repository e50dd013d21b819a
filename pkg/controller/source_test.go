package controller

import (
	"testing"

	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestDescribeSource(t *testing.T) {
	cases := []struct {
		name string
		spec cdiv1.DataVolumeSpec
		want string
	}{
		{"no source", cdiv1.DataVolumeSpec{}, "none"},
		{"empty source", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{}}, "unknown"},
		{"sourceRef wins", cdiv1.DataVolumeSpec{SourceRef: &cdiv1.DataVolumeSourceRef{Kind: "DataSource", Name: "x"}}, "sourceRef:DataSource"},
		{"http", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://x"}}}, "http"},
		{"s3", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{S3: &cdiv1.DataVolumeSourceS3{}}}, "s3"},
		{"gcs", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{GCS: &cdiv1.DataVolumeSourceGCS{}}}, "gcs"},
		{"registry", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To("docker://x")}}}, "registry"},
		{"pvc", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{}}}, "pvc"},
		{"snapshot", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{}}}, "snapshot"},
		{"upload", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}}, "upload"},
		{"blank", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}}, "blank"},
		{"imageio", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Imageio: &cdiv1.DataVolumeSourceImageIO{}}}, "imageio"},
		{"vddk", cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{VDDK: &cdiv1.DataVolumeSourceVDDK{}}}, "vddk"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := describeSource(&cdiv1.DataVolume{Spec: c.spec}); got != c.want {
				t.Errorf("describeSource = %q, want %q", got, c.want)
			}
		})
	}
}
