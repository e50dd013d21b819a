// Package v1beta1 holds the upload.cdi.kubevirt.io/v1beta1 types, served only
// by Kubefill's aggregated API server and never stored.
//
// +kubebuilder:object:generate=true
// +groupName=upload.cdi.kubevirt.io
package v1beta1
