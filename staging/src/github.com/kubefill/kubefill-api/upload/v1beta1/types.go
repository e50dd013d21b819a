package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the upload API group.
const GroupName = "upload.cdi.kubevirt.io"

// SchemeGroupVersion is the group and version of UploadTokenRequest.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1beta1"}

var (
	// SchemeBuilder registers this package's types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &UploadTokenRequest{}, &UploadTokenRequestList{})
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}

// UploadTokenRequest asks for a short-lived token that lets its bearer upload
// into one PVC through the upload proxy.
//
// +kubebuilder:object:root=true
type UploadTokenRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec UploadTokenRequestSpec `json:"spec"`
	// +optional
	Status UploadTokenRequestStatus `json:"status,omitempty"`
}

// UploadTokenRequestSpec names the claim to upload into.
type UploadTokenRequestSpec struct {
	PvcName string `json:"pvcName"`
}

// UploadTokenRequestStatus carries the issued token.
type UploadTokenRequestStatus struct {
	// +optional
	Token string `json:"token,omitempty"`
}

// UploadTokenRequestList is a list of UploadTokenRequests.
//
// +kubebuilder:object:root=true
type UploadTokenRequestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []UploadTokenRequest `json:"items"`
}
