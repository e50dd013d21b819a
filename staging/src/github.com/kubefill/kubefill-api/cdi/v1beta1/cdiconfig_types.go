package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CDIConfigName is the name of the one CDIConfig object.
const CDIConfigName = "config"

// CDIConfig is the cluster-wide user configuration. There is one, named
// "config"; its status holds the values in force.
//
// +kubebuilder:object:root=true
// +kubebuilder:storageversion
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:subresource:status
// +kubebuilder:validation:XValidation:rule="self.metadata.name == 'config'",message="the CDIConfig must be named config"
type CDIConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   CDIConfigSpec   `json:"spec"`
	Status CDIConfigStatus `json:"status,omitempty"`
}

// Percent is a fraction written as a string, from "0" to "1".
// +kubebuilder:validation:Pattern=`^(0(?:\.\d{1,3})?|1)$`
type Percent string

// DefaultFilesystemOverhead is the share of a Filesystem volume kept free for
// the filesystem itself unless configured otherwise.
const DefaultFilesystemOverhead Percent = "0.06"

// FilesystemOverhead is the share of a Filesystem volume reserved for the
// filesystem, globally and per StorageClass.
type FilesystemOverhead struct {
	// +optional
	Global Percent `json:"global,omitempty"`
	// +optional
	StorageClass map[string]Percent `json:"storageClass,omitempty"`
}

// CDIConfigSpec is what a user configures.
type CDIConfigSpec struct {
	// UploadProxyURLOverride replaces the upload proxy URL that Kubefill works out.
	// +optional
	UploadProxyURLOverride *string `json:"uploadProxyURLOverride,omitempty"`
	// +optional
	ImportProxy *ImportProxy `json:"importProxy,omitempty"`
	// +optional
	ScratchSpaceStorageClass *string `json:"scratchSpaceStorageClass,omitempty"`
	// +optional
	PodResourceRequirements *corev1.ResourceRequirements `json:"podResourceRequirements,omitempty"`
	// +optional
	FeatureGates []string `json:"featureGates,omitempty"`
	// +optional
	FilesystemOverhead *FilesystemOverhead `json:"filesystemOverhead,omitempty"`
	// +optional
	Preallocation *bool `json:"preallocation,omitempty"`
	// +optional
	InsecureRegistries []string `json:"insecureRegistries,omitempty"`
	// Deprecated: CDI removed DataVolume garbage collection in v1.62; kept so old objects still parse.
	// +optional
	DataVolumeTTLSeconds *int32 `json:"dataVolumeTTLSeconds,omitempty"`
	// +optional
	TLSSecurityProfile *TLSSecurityProfile `json:"tlsSecurityProfile,omitempty"`
	// +optional
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// +optional
	LogVerbosity *int32 `json:"logVerbosity,omitempty"`
}

// CDIConfigStatus holds the values in force.
type CDIConfigStatus struct {
	// +optional
	UploadProxyURL *string `json:"uploadProxyURL,omitempty"`
	// +optional
	UploadProxyCA *string `json:"uploadProxyCA,omitempty"`
	// +optional
	ImportProxy *ImportProxy `json:"importProxy,omitempty"`
	// +optional
	ScratchSpaceStorageClass string `json:"scratchSpaceStorageClass,omitempty"`
	// +optional
	DefaultPodResourceRequirements *corev1.ResourceRequirements `json:"defaultPodResourceRequirements,omitempty"`
	// +optional
	FilesystemOverhead *FilesystemOverhead `json:"filesystemOverhead,omitempty"`
	// +optional
	Preallocation bool `json:"preallocation,omitempty"`
	// +optional
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
}

// CDIConfigList is a list of CDIConfigs.
//
// +kubebuilder:object:root=true
type CDIConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []CDIConfig `json:"items"`
}

// ImportProxy is the proxy the importer pod uses. CDI spells the first two
// JSON keys in capitals.
type ImportProxy struct {
	// +optional
	HTTPProxy *string `json:"HTTPProxy,omitempty"`
	// +optional
	HTTPSProxy *string `json:"HTTPSProxy,omitempty"`
	// +optional
	NoProxy *string `json:"noProxy,omitempty"`
	// TrustedCAProxy names a ConfigMap with a CA bundle for the proxy.
	// +optional
	TrustedCAProxy *string `json:"trustedCAProxy,omitempty"`
}

// TLSSecurityProfile picks the TLS settings of Kubefill's servers, in the
// shape OpenShift's config API uses.
type TLSSecurityProfile struct {
	// +kubebuilder:validation:Enum="Old";"Intermediate";"Modern";"Custom"
	// +optional
	Type TLSProfileType `json:"type"`
	// +optional
	// +nullable
	Old *OldTLSProfile `json:"old,omitempty"`
	// +optional
	// +nullable
	Intermediate *IntermediateTLSProfile `json:"intermediate,omitempty"`
	// +optional
	// +nullable
	Modern *ModernTLSProfile `json:"modern,omitempty"`
	// +optional
	// +nullable
	Custom *CustomTLSProfile `json:"custom,omitempty"`
}

// TLSProfileType names a TLS profile.
type TLSProfileType string

// The TLS profiles.
const (
	TLSProfileOldType          TLSProfileType = "Old"
	TLSProfileIntermediateType TLSProfileType = "Intermediate"
	TLSProfileModernType       TLSProfileType = "Modern"
	TLSProfileCustomType       TLSProfileType = "Custom"
)

// OldTLSProfile allows old clients.
type OldTLSProfile struct{}

// IntermediateTLSProfile is the default.
type IntermediateTLSProfile struct{}

// ModernTLSProfile allows TLS 1.3 only.
type ModernTLSProfile struct{}

// CustomTLSProfile lists ciphers and a minimum version by hand.
type CustomTLSProfile struct {
	TLSProfileSpec `json:",inline"`
}

// TLSProfileSpec is a cipher list and a minimum TLS version.
type TLSProfileSpec struct {
	Ciphers []string `json:"ciphers"`
	// +kubebuilder:validation:Enum="VersionTLS10";"VersionTLS11";"VersionTLS12";"VersionTLS13"
	MinTLSVersion TLSProtocolVersion `json:"minTLSVersion"`
}

// TLSProtocolVersion is a TLS version such as "VersionTLS12".
type TLSProtocolVersion string
