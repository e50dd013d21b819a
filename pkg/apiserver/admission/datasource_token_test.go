package admission

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/token"
)

func TestUnresolvedDataSource(t *testing.T) {
	notFound := apierrors.NewNotFound(schema.GroupResource{Group: cdiv1.GroupName, Resource: "datasources"}, "fedora")
	ref := func(ns *string) *cdiv1.DataVolume {
		return &cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{SourceRef: &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Namespace: ns, Name: "fedora"}}}
	}
	for _, c := range []struct {
		name   string
		dv     *cdiv1.DataVolume
		err    error
		wantOK bool
		wantNS string
	}{
		{"DataSource not found: its namespace", ref(ptr("os-images")), notFound, true, "os-images"},
		{"DataSource names no source yet", ref(ptr("os-images")), nil, true, "os-images"},
		{"sourceRef without namespace: the DataVolume's", withNS(ref(nil), "vms"), notFound, true, "vms"},
		{"another read error is not guessed at", ref(ptr("os-images")), errors.New("connection refused"), false, ""},
		{"a direct source is not a sourceRef", &cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Name: "x"}}}}, nil, false, ""},
		{"no sourceRef", &cdiv1.DataVolume{}, nil, false, ""},
	} {
		got, ok := unresolvedDataSource(c.dv, c.err)
		if ok != c.wantOK {
			t.Errorf("%s: ok %v, want %v", c.name, ok, c.wantOK)
			continue
		}
		if !ok {
			continue
		}
		if got.Resource != token.ResourceDataSource || got.Namespace != c.wantNS || got.Name != "fedora" || !got.IsDataSource() {
			t.Errorf("%s: got %+v, want DataSource %s/fedora", c.name, got, c.wantNS)
		}
	}
}

func withNS(dv *cdiv1.DataVolume, ns string) *cdiv1.DataVolume {
	dv.Namespace = ns
	return dv
}
