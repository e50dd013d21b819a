package v1beta1

import (
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// virtctl sends and reads exactly this JSON.
func TestUploadTokenRequestWireFormat(t *testing.T) {
	req := UploadTokenRequest{
		TypeMeta:   metav1.TypeMeta{APIVersion: "upload.cdi.kubevirt.io/v1beta1", Kind: "UploadTokenRequest"},
		ObjectMeta: metav1.ObjectMeta{Name: "token-for-virtctl-abcde", Namespace: "vms"},
		Spec:       UploadTokenRequestSpec{PvcName: "disk"},
		Status:     UploadTokenRequestStatus{Token: "eyJhbGciOiJQUzI1NiJ9.e30.sig"},
	}
	got, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kind":"UploadTokenRequest","apiVersion":"upload.cdi.kubevirt.io/v1beta1","metadata":{"name":"token-for-virtctl-abcde","namespace":"vms"},"spec":{"pvcName":"disk"},"status":{"token":"eyJhbGciOiJQUzI1NiJ9.e30.sig"}}`
	if string(got) != want {
		t.Errorf("wire JSON\n got %s\nwant %s", got, want)
	}
}
