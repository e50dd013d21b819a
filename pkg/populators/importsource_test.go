package populators

import (
	"reflect"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestResolveImportSource(t *testing.T) {
	cases := []struct {
		name    string
		src     *cdiv1.ImportSourceType
		source  string
		wantErr string
	}{
		{"http", &cdiv1.ImportSourceType{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "http://x", Checksum: "sha256:ab"}}, "http", ""},
		{"s3", &cdiv1.ImportSourceType{S3: &cdiv1.DataVolumeSourceS3{URL: "s3://b/k"}}, "s3", ""},
		{"registry", &cdiv1.ImportSourceType{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To("docker://r/i")}}, "registry", ""},
		{"blank", &cdiv1.ImportSourceType{Blank: &cdiv1.DataVolumeBlankImage{}}, "none", ""},
		{"image stream", &cdiv1.ImportSourceType{Registry: &cdiv1.DataVolumeSourceRegistry{ImageStream: ptr.To("is")}}, "", "image stream"},
		{"node pull", &cdiv1.ImportSourceType{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To("docker://r/i"), PullMethod: ptr.To(cdiv1.RegistryPullNode)}}, "", "pullMethod node"},
		{"vddk", &cdiv1.ImportSourceType{VDDK: &cdiv1.DataVolumeSourceVDDK{}}, "", "not supported"},
		{"nothing", nil, "", "names no source"},
	}
	for _, c := range cases {
		ep, err := ResolveImportSource(cdiv1.VolumeImportSourceSpec{Source: c.src})
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: error %v, want one containing %q", c.name, err, c.wantErr)
			}
			continue
		}
		if err != nil || ep.Source != c.source {
			t.Errorf("%s: got %+v, %v; want source %s", c.name, ep, err, c.source)
		}
	}
}

func TestImageLabelsForClaim(t *testing.T) {
	image := map[string]string{
		"instancetype.kubevirt.io/default-instancetype": "u1.small",
		"instancetype.kubevirt.io/default-preference":   "fedora",
		"kubevirt.io/test":                                    "x",
		"evil.example.com/owner":                              "me",    // not a kubevirt.io domain
		"notkubevirt.io/x":                                    "y",     // a lookalike domain
		"app.kubernetes.io/managed-by":                        "image", // another domain
		"instancetype.kubevirt.io/bad-value":                  "spaces are not allowed",
		"instancetype.kubevirt.io/" + strings.Repeat("n", 70): "too-long-name",
	}
	claim := map[string]string{"instancetype.kubevirt.io/default-preference": "rhel"}
	got := ImageLabelsForClaim(claim, image)
	want := map[string]string{"instancetype.kubevirt.io/default-instancetype": "u1.small", "kubevirt.io/test": "x"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ImageLabelsForClaim = %v, want %v (the claim's own label kept, nothing outside kubevirt.io, only valid labels)", got, want)
	}
	if got := ImageLabelsForClaim(nil, nil); len(got) != 0 {
		t.Errorf("no image labels gave %v", got)
	}
}
