package clone

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestPriorityFromOtherNamespace(t *testing.T) {
	for _, tc := range []struct {
		name string
		vcs  *cdiv1.VolumeCloneSource
		want bool
	}{
		{"the source namespace's own", &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: "golden"}}, false},
		{"a DataVolume's in its namespace", &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: "golden",
			OwnerReferences: []metav1.OwnerReference{{Kind: "DataVolume", Name: "dv", Controller: ptr.To(true)}}}}, false},
		{"a DataVolume's of another namespace", &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: "golden",
			Annotations: map[string]string{cdiv1.AnnOwnedByDataVolume: "tgt/dv"}}}, true},
	} {
		if got := priorityFromOtherNamespace(tc.vcs); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
