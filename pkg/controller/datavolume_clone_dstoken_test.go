package controller

import (
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/token"
)

func TestDataSourceTokenFor(t *testing.T) {
	dv := &cdiv1.DataVolume{}
	dv.Namespace, dv.Name = "vms", "rootdisk"
	dv.Spec.SourceRef = &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Namespace: ptr.To("os-images"), Name: "fedora"}
	dsToken := token.NewClonePayload(token.ResourceDataSource, "os-images", "fedora", "vms", "rootdisk")
	for _, c := range []struct {
		name    string
		p       *token.Payload
		dv      *cdiv1.DataVolume
		src     CloneSource
		wantErr string
	}{
		{"resolved to a claim in the DataSource's namespace", dsToken, dv, CloneSource{Namespace: "os-images", Name: "fedora-0123456789ab"}, ""},
		{"resolved to a snapshot there", dsToken, dv, CloneSource{Snapshot: true, Namespace: "os-images", Name: "fedora-0123456789ab"}, ""},
		{"resolved into another namespace", dsToken, dv, CloneSource{Namespace: "elsewhere", Name: "disk"}, "allows cloning from namespace os-images"},
		{"token for another DataSource", token.NewClonePayload(token.ResourceDataSource, "os-images", "centos", "vms", "rootdisk"), dv, CloneSource{Namespace: "os-images", Name: "x"}, "name"},
		{"token for another target", token.NewClonePayload(token.ResourceDataSource, "os-images", "fedora", "vms", "other"), dv, CloneSource{Namespace: "os-images", Name: "x"}, "target"},
		{"DataVolume without sourceRef", dsToken, &cdiv1.DataVolume{}, CloneSource{Namespace: "os-images", Name: "x"}, "no sourceRef"},
	} {
		got, err := dataSourceTokenFor(c.p, c.dv, c.src)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: error %v, want one saying %q", c.name, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		// The payload now names the resolved source, so the extended and
		// claim tokens minted from it check as for any other clone.
		if err := token.CheckClone(got, c.src.Resource(), c.src.Namespace, c.src.Name, "vms", "rootdisk"); err != nil {
			t.Errorf("%s: re-targeted payload %+v: %v", c.name, got, err)
		}
	}
}
