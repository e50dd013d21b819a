// Package v1beta1 holds Kubefill's Go types for CDI's cdi.kubevirt.io/v1beta1
// API. The JSON they marshal to is CDI's wire format, field for field, so that
// KubeVirt and virtctl talk to Kubefill unchanged.
//
// +kubebuilder:object:generate=true
// +groupName=cdi.kubevirt.io
package v1beta1
