package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The populator kinds a PVC's spec.dataSourceRef may name.
const (
	VolumeImportSourceRef = "VolumeImportSource"
	VolumeUploadSourceRef = "VolumeUploadSource"
	VolumeCloneSourceRef  = "VolumeCloneSource"
)

// VolumeImportSource tells the import populator how to fill a PVC whose
// dataSourceRef names it.
//
// +kubebuilder:object:root=true
// +kubebuilder:storageversion
type VolumeImportSource struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VolumeImportSourceSpec `json:"spec"`
	// +optional
	Status VolumeImportSourceStatus `json:"status"`
}

// VolumeImportSourceSpec is an import's source and options.
type VolumeImportSourceSpec struct {
	// +optional
	Source *ImportSourceType `json:"source,omitempty"`
	// +optional
	Preallocation *bool `json:"preallocation,omitempty"`
	// +kubebuilder:validation:Enum="kubevirt";"archive"
	// +optional
	ContentType DataVolumeContentType `json:"contentType,omitempty"`
	// TargetClaim names the claim a multi-stage import fills.
	// +optional
	TargetClaim *string `json:"targetClaim,omitempty"`
	// +optional
	Checkpoints []DataVolumeCheckpoint `json:"checkpoints,omitempty"`
	// +optional
	FinalCheckpoint *bool `json:"finalCheckpoint,omitempty"`
}

// ImportSourceType names exactly one place an import reads from.
//
// +kubebuilder:validation:XValidation:rule="[has(self.http), has(self.s3), has(self.registry), has(self.gcs), has(self.blank), has(self.imageio), has(self.vddk)].exists_one(x, x)",message="source must name exactly one of http, s3, registry, gcs, blank, imageio or vddk"
type ImportSourceType struct {
	HTTP     *DataVolumeSourceHTTP     `json:"http,omitempty"`
	S3       *DataVolumeSourceS3       `json:"s3,omitempty"`
	Registry *DataVolumeSourceRegistry `json:"registry,omitempty"`
	GCS      *DataVolumeSourceGCS      `json:"gcs,omitempty"`
	Blank    *DataVolumeBlankImage     `json:"blank,omitempty"`
	Imageio  *DataVolumeSourceImageIO  `json:"imageio,omitempty"`
	VDDK     *DataVolumeSourceVDDK     `json:"vddk,omitempty"`
}

// VolumeImportSourceStatus is empty; progress is reported on the PVC.
type VolumeImportSourceStatus struct{}

// VolumeImportSourceList is a list of VolumeImportSources.
//
// +kubebuilder:object:root=true
type VolumeImportSourceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []VolumeImportSource `json:"items"`
}

// VolumeUploadSource tells the upload populator to accept an upload into a
// PVC whose dataSourceRef names it.
//
// +kubebuilder:object:root=true
// +kubebuilder:storageversion
type VolumeUploadSource struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VolumeUploadSourceSpec `json:"spec"`
	// +optional
	Status VolumeUploadSourceStatus `json:"status,omitempty"`
}

// VolumeUploadSourceSpec holds an upload's options.
type VolumeUploadSourceSpec struct {
	// +kubebuilder:validation:Enum="kubevirt";"archive"
	// +optional
	ContentType DataVolumeContentType `json:"contentType,omitempty"`
	// +optional
	Preallocation *bool `json:"preallocation,omitempty"`
}

// VolumeUploadSourceStatus is empty; progress is reported on the PVC.
type VolumeUploadSourceStatus struct{}

// VolumeUploadSourceList is a list of VolumeUploadSources.
//
// +kubebuilder:object:root=true
type VolumeUploadSourceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []VolumeUploadSource `json:"items"`
}

// VolumeCloneSource tells the clone populator which PVC or VolumeSnapshot to
// copy into a PVC whose dataSourceRef names it.
//
// +kubebuilder:object:root=true
// +kubebuilder:storageversion
type VolumeCloneSource struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VolumeCloneSourceSpec `json:"spec"`
}

// VolumeCloneSourceSpec names the clone's source.
type VolumeCloneSourceSpec struct {
	// Source is a PersistentVolumeClaim (apiGroup empty) or a
	// snapshot.storage.k8s.io VolumeSnapshot, in the source's namespace.
	// +kubebuilder:validation:XValidation:rule="self.kind == 'PersistentVolumeClaim' || self.kind == 'VolumeSnapshot'",message="clone source kind must be PersistentVolumeClaim or VolumeSnapshot"
	Source corev1.TypedLocalObjectReference `json:"source"`
	// +optional
	Preallocation *bool `json:"preallocation,omitempty"`
	// +optional
	PriorityClassName *string `json:"priorityClassName,omitempty"`
}

// VolumeCloneSourceList is a list of VolumeCloneSources.
//
// +kubebuilder:object:root=true
type VolumeCloneSourceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []VolumeCloneSource `json:"items"`
}
