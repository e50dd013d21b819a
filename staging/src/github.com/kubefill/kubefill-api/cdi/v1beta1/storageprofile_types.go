package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StorageProfile holds Kubefill's advice for one StorageClass: the claim
// properties that work with it and the clone strategy to use. It is named
// after the class.
//
// +kubebuilder:object:root=true
// +kubebuilder:storageversion
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:subresource:status
type StorageProfile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   StorageProfileSpec   `json:"spec"`
	Status StorageProfileStatus `json:"status,omitempty"`
}

// StorageProfileSpec holds what an administrator sets by hand.
type StorageProfileSpec struct {
	// +kubebuilder:validation:Enum="copy";"snapshot";"csi-clone"
	// +optional
	CloneStrategy *CDICloneStrategy `json:"cloneStrategy,omitempty"`
	// +kubebuilder:validation:MaxItems=8
	// +optional
	ClaimPropertySets []ClaimPropertySet `json:"claimPropertySets,omitempty"`
	// +kubebuilder:validation:Enum="pvc";"snapshot"
	// +optional
	DataImportCronSourceFormat *DataImportCronSourceFormat `json:"dataImportCronSourceFormat,omitempty"`
	// SnapshotClass picks the VolumeSnapshotClass for snapshot clones; by default one matching the driver.
	// +optional
	SnapshotClass *string `json:"snapshotClass,omitempty"`
}

// StorageProfileStatus is the advice in force: the spec merged with what
// Kubefill detected.
type StorageProfileStatus struct {
	// +optional
	StorageClass *string `json:"storageClass,omitempty"`
	// +optional
	Provisioner *string `json:"provisioner,omitempty"`
	// +optional
	CloneStrategy *CDICloneStrategy `json:"cloneStrategy,omitempty"`
	// +kubebuilder:validation:MaxItems=8
	// +optional
	ClaimPropertySets []ClaimPropertySet `json:"claimPropertySets,omitempty"`
	// +optional
	DataImportCronSourceFormat *DataImportCronSourceFormat `json:"dataImportCronSourceFormat,omitempty"`
	// +optional
	SnapshotClass *string `json:"snapshotClass,omitempty"`
	// Conditions is a Kubefill addition that CDI's clients ignore. Its
	// Recognized condition says whether the claim property sets come from the
	// known-provisioner table or the spec (True), or are unknown (False).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// StorageProfileRecognized is the type of the condition that says whether
// a StorageProfile's claim property sets are known.
const StorageProfileRecognized = "Recognized"

// ClaimPropertySet is one combination of access modes and volume mode that
// works with a StorageClass, best first.
type ClaimPropertySet struct {
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:XValidation:rule="self.all(am, am in ['ReadWriteOnce', 'ReadOnlyMany', 'ReadWriteMany', 'ReadWriteOncePod'])",message="Illegal AccessMode"
	AccessModes []corev1.PersistentVolumeAccessMode `json:"accessModes"`
	// +kubebuilder:validation:Enum="Block";"Filesystem"
	VolumeMode *corev1.PersistentVolumeMode `json:"volumeMode"`
}

// StorageProfileList is a list of StorageProfiles.
//
// +kubebuilder:object:root=true
type StorageProfileList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []StorageProfile `json:"items"`
}

// CDICloneStrategy is how a clone copies its data.
type CDICloneStrategy string

const (
	// CloneStrategyHostAssisted copies through a source pod and an upload server.
	CloneStrategyHostAssisted CDICloneStrategy = "copy"
	// CloneStrategySnapshot takes a VolumeSnapshot and restores it.
	CloneStrategySnapshot CDICloneStrategy = "snapshot"
	// CloneStrategyCsiClone asks the CSI driver to clone the volume.
	CloneStrategyCsiClone CDICloneStrategy = "csi-clone"
)

// DataImportCronSourceFormat is how DataImportCron keeps its images.
type DataImportCronSourceFormat string

const (
	DataImportCronSourceFormatSnapshot DataImportCronSourceFormat = "snapshot"
	DataImportCronSourceFormatPvc      DataImportCronSourceFormat = "pvc"
)
