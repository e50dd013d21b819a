package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DataVolume asks for a PersistentVolumeClaim filled from a source: an import,
// an upload or a clone. It renders the claim and reports the transfer's
// progress.
//
// +kubebuilder:object:root=true
// +kubebuilder:storageversion
// +kubebuilder:resource:shortName=dv;dvs,categories=all
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Phase",type="string",JSONPath=".status.phase",description="The phase the data volume is in"
// +kubebuilder:printcolumn:name="Progress",type="string",JSONPath=".status.progress",description="Transfer progress in percentage if known, N/A otherwise"
// +kubebuilder:printcolumn:name="Restarts",type="integer",JSONPath=".status.restartCount",description="The number of times the transfer has been restarted."
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type DataVolume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec DataVolumeSpec `json:"spec"`
	// +optional
	Status DataVolumeStatus `json:"status,omitempty"`
}

// DataVolumeSpec says where the data comes from and what claim receives it.
//
// +kubebuilder:validation:XValidation:rule="has(self.source) != has(self.sourceRef)",message="exactly one of spec.source or spec.sourceRef must be set"
// +kubebuilder:validation:XValidation:rule="has(self.pvc) != has(self.storage)",message="exactly one of spec.pvc or spec.storage must be set"
type DataVolumeSpec struct {
	// Source is where the data comes from.
	// +optional
	Source *DataVolumeSource `json:"source,omitempty"`
	// SourceRef names a DataSource that resolves to the source.
	// +optional
	SourceRef *DataVolumeSourceRef `json:"sourceRef,omitempty"`
	// PVC is the claim's spec, used exactly as written.
	// +optional
	PVC *corev1.PersistentVolumeClaimSpec `json:"pvc,omitempty"`
	// Storage is the claim's spec, completed from the StorageProfile of its class.
	// +optional
	Storage *StorageSpec `json:"storage,omitempty"`
	// PriorityClassName is given to the worker pod (importer, uploader or cloner).
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// ContentType is "kubevirt" (a disk image, the default) or "archive" (a tar to unpack).
	// +kubebuilder:validation:Enum="kubevirt";"archive"
	// +optional
	ContentType DataVolumeContentType `json:"contentType,omitempty"`
	// Checkpoints are the stages of a multi-stage (warm) import.
	// +optional
	Checkpoints []DataVolumeCheckpoint `json:"checkpoints,omitempty"`
	// FinalCheckpoint says the current checkpoint is the last one.
	// +optional
	FinalCheckpoint bool `json:"finalCheckpoint,omitempty"`
	// Preallocation asks for the volume's storage to be allocated in advance.
	// +optional
	Preallocation *bool `json:"preallocation,omitempty"`
}

// StorageSpec is the part of a claim's spec that a StorageProfile can complete:
// whatever is left out here is taken from the profile's recommendations.
type StorageSpec struct {
	// +optional
	AccessModes []corev1.PersistentVolumeAccessMode `json:"accessModes,omitempty"`
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	// +optional
	Resources corev1.VolumeResourceRequirements `json:"resources,omitempty"`
	// +optional
	VolumeName string `json:"volumeName,omitempty"`
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`
	// +optional
	VolumeMode *corev1.PersistentVolumeMode `json:"volumeMode,omitempty"`
	// +optional
	DataSource *corev1.TypedLocalObjectReference `json:"dataSource,omitempty"`
	// +optional
	DataSourceRef *corev1.TypedObjectReference `json:"dataSourceRef,omitempty"`
}

// PersistentVolumeFromStorageProfile as a volume mode asks for the mode the
// StorageProfile recommends.
const PersistentVolumeFromStorageProfile corev1.PersistentVolumeMode = "FromStorageProfile"

// DataVolumeCheckpoint is one stage of a multi-stage import.
type DataVolumeCheckpoint struct {
	// Previous is the snapshot identifier of the previous checkpoint.
	Previous string `json:"previous"`
	// Current is the snapshot identifier of this checkpoint.
	Current string `json:"current"`
}

// DataVolumeContentType says what the transferred bytes are.
type DataVolumeContentType string

const (
	// DataVolumeKubeVirt is a disk image (the default).
	DataVolumeKubeVirt DataVolumeContentType = "kubevirt"
	// DataVolumeArchive is a tar archive unpacked into a Filesystem volume.
	DataVolumeArchive DataVolumeContentType = "archive"
)

// DataVolumeSource names exactly one place the data comes from.
//
// +kubebuilder:validation:XValidation:rule="[has(self.http), has(self.s3), has(self.gcs), has(self.registry), has(self.pvc), has(self.upload), has(self.blank), has(self.imageio), has(self.vddk), has(self.snapshot)].exists_one(x, x)",message="spec.source must name exactly one of http, s3, gcs, registry, pvc, upload, blank, imageio, vddk or snapshot"
type DataVolumeSource struct {
	HTTP     *DataVolumeSourceHTTP     `json:"http,omitempty"`
	S3       *DataVolumeSourceS3       `json:"s3,omitempty"`
	GCS      *DataVolumeSourceGCS      `json:"gcs,omitempty"`
	Registry *DataVolumeSourceRegistry `json:"registry,omitempty"`
	PVC      *DataVolumeSourcePVC      `json:"pvc,omitempty"`
	Upload   *DataVolumeSourceUpload   `json:"upload,omitempty"`
	Blank    *DataVolumeBlankImage     `json:"blank,omitempty"`
	Imageio  *DataVolumeSourceImageIO  `json:"imageio,omitempty"`
	VDDK     *DataVolumeSourceVDDK     `json:"vddk,omitempty"`
	Snapshot *DataVolumeSourceSnapshot `json:"snapshot,omitempty"`
}

// DataVolumeSourcePVC names a claim to clone.
type DataVolumeSourcePVC struct {
	// +kubebuilder:validation:MinLength=1
	Namespace string `json:"namespace"`
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// DataVolumeSourceSnapshot names a VolumeSnapshot to clone.
type DataVolumeSourceSnapshot struct {
	// +kubebuilder:validation:MinLength=1
	Namespace string `json:"namespace"`
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// DataSourceRefSourceDataSource points a DataSource at another DataSource
// (one level deep at most).
type DataSourceRefSourceDataSource struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// DataVolumeBlankImage asks for an empty disk of the claim's size.
type DataVolumeBlankImage struct{}

// DataVolumeSourceUpload asks for an upload server the user streams into.
type DataVolumeSourceUpload struct{}

// DataVolumeSourceS3 imports an object from S3-compatible storage.
type DataVolumeSourceS3 struct {
	// +kubebuilder:validation:MinLength=1
	URL string `json:"url"`
	// SecretRef names a Secret with accessKeyId and secretKey.
	// +optional
	SecretRef string `json:"secretRef,omitempty"`
	// CertConfigMap names a ConfigMap holding a CA bundle to trust.
	// +optional
	CertConfigMap string `json:"certConfigMap,omitempty"`
}

// DataVolumeSourceGCS imports an object from Google Cloud Storage.
type DataVolumeSourceGCS struct {
	// +kubebuilder:validation:MinLength=1
	URL string `json:"url"`
	// +optional
	SecretRef string `json:"secretRef,omitempty"`
}

// DataVolumeSourceRegistry imports the disk held in a container image.
//
// +kubebuilder:validation:XValidation:rule="has(self.url) != has(self.imageStream)",message="registry source needs exactly one of url or imageStream"
// +kubebuilder:validation:XValidation:rule="!has(self.url) || self.url.startsWith('docker://') || self.url.startsWith('oci-archive://')",message="registry url must start with docker:// or oci-archive://"
type DataVolumeSourceRegistry struct {
	// URL is docker://<image> or oci-archive://<path>.
	// +optional
	URL *string `json:"url,omitempty"`
	// ImageStream names an OpenShift image stream.
	// +optional
	ImageStream *string `json:"imageStream,omitempty"`
	// PullMethod is "pod" (the importer pulls) or "node" (the node's runtime pulls).
	// +kubebuilder:validation:Enum="pod";"node"
	// +optional
	PullMethod *RegistryPullMethod `json:"pullMethod,omitempty"`
	// +optional
	SecretRef *string `json:"secretRef,omitempty"`
	// +optional
	CertConfigMap *string `json:"certConfigMap,omitempty"`
	// +optional
	Platform *PlatformOptions `json:"platform,omitempty"`
}

// PlatformOptions selects one image of a multi-platform index.
type PlatformOptions struct {
	// +optional
	Architecture string `json:"architecture,omitempty"`
}

const (
	// RegistrySchemeDocker is the URL scheme of an image in a registry.
	RegistrySchemeDocker = "docker"
	// RegistrySchemeOci is the URL scheme of an OCI archive file.
	RegistrySchemeOci = "oci-archive"
)

// RegistryPullMethod says who pulls a registry image.
type RegistryPullMethod string

const (
	// RegistryPullPod has the importer pod pull the image itself.
	RegistryPullPod RegistryPullMethod = "pod"
	// RegistryPullNode has the node's container runtime pull it.
	RegistryPullNode RegistryPullMethod = "node"
)

// DataVolumeSourceHTTP imports from an http or https URL.
type DataVolumeSourceHTTP struct {
	// +kubebuilder:validation:MinLength=1
	URL string `json:"url"`
	// SecretRef names a Secret with accessKeyId (user) and secretKey (password) for basic auth.
	// +optional
	SecretRef string `json:"secretRef,omitempty"`
	// CertConfigMap names a ConfigMap holding a CA bundle to trust.
	// +optional
	CertConfigMap string `json:"certConfigMap,omitempty"`
	// ExtraHeaders are "Name: value" headers sent with every request.
	// +optional
	ExtraHeaders []string `json:"extraHeaders,omitempty"`
	// SecretExtraHeaders name Secrets, each holding more headers that must not be shown.
	// +optional
	SecretExtraHeaders []string `json:"secretExtraHeaders,omitempty"`
	// Checksum is "<algorithm>:<hex>" (md5, sha1, sha256 or sha512) of the source bytes.
	// +kubebuilder:validation:Pattern=`^(md5|sha1|sha256|sha512):[0-9a-fA-F]+$`
	// +optional
	Checksum string `json:"checksum,omitempty"`
}

// DataVolumeSourceImageIO imports a disk from oVirt's imageio.
type DataVolumeSourceImageIO struct {
	URL    string `json:"url"`
	DiskID string `json:"diskId"`
	// +optional
	SecretRef string `json:"secretRef,omitempty"`
	// +optional
	CertConfigMap string `json:"certConfigMap,omitempty"`
	// +optional
	InsecureSkipVerify *bool `json:"insecureSkipVerify,omitempty"`
}

// DataVolumeSourceVDDK imports a disk from VMware through VDDK.
type DataVolumeSourceVDDK struct {
	// +optional
	URL string `json:"url,omitempty"`
	// +optional
	UUID string `json:"uuid,omitempty"`
	// +optional
	BackingFile string `json:"backingFile,omitempty"`
	// +optional
	Thumbprint string `json:"thumbprint,omitempty"`
	// +optional
	SecretRef string `json:"secretRef,omitempty"`
	// +optional
	InitImageURL string `json:"initImageURL,omitempty"`
	// +optional
	ExtraArgs string `json:"extraArgs,omitempty"`
}

// DataVolumeSourceRef points at a DataSource that resolves to the source.
type DataVolumeSourceRef struct {
	// Kind is "DataSource", the only kind supported.
	// +kubebuilder:validation:Enum="DataSource"
	Kind string `json:"kind"`
	// Namespace defaults to the DataVolume's.
	// +optional
	Namespace *string `json:"namespace,omitempty"`
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// DataVolumeDataSource is the one kind a sourceRef may name.
const DataVolumeDataSource = "DataSource"

// DataVolumeStatus is what the controller last saw of the transfer.
type DataVolumeStatus struct {
	// ClaimName is the claim that receives the data.
	// +optional
	ClaimName string `json:"claimName,omitempty"`
	// +optional
	Phase DataVolumePhase `json:"phase,omitempty"`
	// +optional
	Progress DataVolumeProgress `json:"progress,omitempty"`
	// RestartCount counts restarts of the worker pod.
	// +optional
	RestartCount int32 `json:"restartCount,omitempty"`
	// +optional
	Conditions []DataVolumeCondition `json:"conditions,omitempty" optional:"true"`
}

// DataVolumeList is a list of DataVolumes.
//
// +kubebuilder:object:root=true
type DataVolumeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []DataVolume `json:"items"`
}

// DataVolumeCondition is one of the Bound, Running and Ready conditions.
type DataVolumeCondition struct {
	Type   DataVolumeConditionType `json:"type"`
	Status corev1.ConditionStatus  `json:"status"`
	// +optional
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
	// +optional
	LastHeartbeatTime metav1.Time `json:"lastHeartbeatTime,omitempty"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}

// DataVolumePhase is where a DataVolume is in its life.
type DataVolumePhase string

// DataVolumeProgress is a percentage such as "45.20%", or "N/A".
type DataVolumeProgress string

// DataVolumeConditionType names a DataVolume condition.
type DataVolumeConditionType string

// The phases a DataVolume reports, as CDI spells them.
const (
	PhaseUnset                        DataVolumePhase = ""
	Pending                           DataVolumePhase = "Pending"
	PVCBound                          DataVolumePhase = "PVCBound"
	ImportScheduled                   DataVolumePhase = "ImportScheduled"
	ImportInProgress                  DataVolumePhase = "ImportInProgress"
	CloneScheduled                    DataVolumePhase = "CloneScheduled"
	CloneInProgress                   DataVolumePhase = "CloneInProgress"
	SnapshotForSmartCloneInProgress   DataVolumePhase = "SnapshotForSmartCloneInProgress"
	CloneFromSnapshotSourceInProgress DataVolumePhase = "CloneFromSnapshotSourceInProgress"
	SmartClonePVCInProgress           DataVolumePhase = "SmartClonePVCInProgress"
	CSICloneInProgress                DataVolumePhase = "CSICloneInProgress"
	ExpansionInProgress               DataVolumePhase = "ExpansionInProgress"
	NamespaceTransferInProgress       DataVolumePhase = "NamespaceTransferInProgress"
	UploadScheduled                   DataVolumePhase = "UploadScheduled"
	UploadReady                       DataVolumePhase = "UploadReady"
	WaitForFirstConsumer              DataVolumePhase = "WaitForFirstConsumer"
	PendingPopulation                 DataVolumePhase = "PendingPopulation"
	PrepClaimInProgress               DataVolumePhase = "PrepClaimInProgress"
	RebindInProgress                  DataVolumePhase = "RebindInProgress"
	Paused                            DataVolumePhase = "Paused"
	Succeeded                         DataVolumePhase = "Succeeded"
	Failed                            DataVolumePhase = "Failed"
	Unknown                           DataVolumePhase = "Unknown"
)

// The condition types a DataVolume reports.
const (
	DataVolumeReady   DataVolumeConditionType = "Ready"
	DataVolumeBound   DataVolumeConditionType = "Bound"
	DataVolumeRunning DataVolumeConditionType = "Running"
)

// ProgressNotAvailable is the progress shown when none is known.
const ProgressNotAvailable DataVolumeProgress = "N/A"

// DataVolumeCloneSourceSubresource is the subresource a user needs "create"
// on, in the source namespace, to clone out of it.
const DataVolumeCloneSourceSubresource = "source"
