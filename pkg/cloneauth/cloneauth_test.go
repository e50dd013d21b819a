package cloneauth

import (
	"testing"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/token"
)

func TestAccessChecks(t *testing.T) {
	explicit, implicit := AccessChecks(Source{Resource: token.ResourcePVC, Namespace: "src", Name: "golden"})
	if len(explicit) != 1 || explicit[0].Group != "cdi.kubevirt.io" || explicit[0].Resource != "datavolumes" ||
		explicit[0].Subresource != "source" || explicit[0].Verb != "create" || explicit[0].Namespace != "src" || explicit[0].Name != "golden" {
		t.Fatalf("explicit: %+v", explicit)
	}
	if len(implicit) != 1 || implicit[0].Resource != "pods" || implicit[0].Group != "" || implicit[0].Namespace != "src" {
		t.Fatalf("implicit for a PVC: %+v", implicit)
	}
	_, implicit = AccessChecks(Source{Resource: token.ResourceVolumeSnapshot, Namespace: "src", Name: "s"})
	if len(implicit) != 2 || implicit[1].Resource != "persistentvolumeclaims" {
		t.Fatalf("implicit for a snapshot: %+v", implicit)
	}
}

// A DataSource not resolved yet is authorised for the whole namespace (no
// object name) and with the stricter snapshot rule, since it may come to
// name a snapshot.
func TestAccessChecksForUnresolvedDataSource(t *testing.T) {
	explicit, implicit := AccessChecks(Source{Resource: token.ResourceDataSource, Namespace: "os-images", Name: "fedora"})
	if len(explicit) != 1 || explicit[0].Name != "" || explicit[0].Namespace != "os-images" || explicit[0].Subresource != cdiv1.DataVolumeCloneSourceSubresource {
		t.Errorf("explicit checks %+v", explicit)
	}
	if len(implicit) != 2 || implicit[0].Resource != "pods" || implicit[1].Resource != "persistentvolumeclaims" {
		t.Errorf("implicit checks %+v", implicit)
	}
}

// A ServiceAccount is reviewed as kube-apiserver authenticates it, so a
// RoleBinding to its namespace's ServiceAccount group counts.
func TestServiceAccountUser(t *testing.T) {
	u := ServiceAccountUser("golden", "importer")
	if u.Username != "system:serviceaccount:golden:importer" {
		t.Errorf("username %q", u.Username)
	}
	want := []string{"system:serviceaccounts", "system:serviceaccounts:golden", "system:authenticated"}
	if len(u.Groups) != len(want) {
		t.Fatalf("groups %v, want %v", u.Groups, want)
	}
	for i := range want {
		if u.Groups[i] != want[i] {
			t.Errorf("groups %v, want %v", u.Groups, want)
		}
	}
}
