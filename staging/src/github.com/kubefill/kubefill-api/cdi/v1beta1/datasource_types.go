package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DataSource is a named, reusable pointer to a clone source: a golden image
// that DataVolumes reference through spec.sourceRef.
//
// +kubebuilder:object:root=true
// +kubebuilder:storageversion
// +kubebuilder:resource:shortName=das,categories=all
// +kubebuilder:subresource:status
type DataSource struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   DataSourceSpec   `json:"spec"`
	Status DataSourceStatus `json:"status,omitempty"`
}

// DataSourceSpec holds the source the DataSource stands for.
type DataSourceSpec struct {
	Source DataSourceSource `json:"source"`
}

// DataSourceSource is a PVC, a snapshot, or another DataSource.
//
// +kubebuilder:validation:XValidation:rule="[has(self.pvc), has(self.snapshot), has(self.dataSource)].filter(x, x).size() <= 1",message="a DataSource source names at most one of pvc, snapshot or dataSource"
type DataSourceSource struct {
	// +optional
	PVC *DataVolumeSourcePVC `json:"pvc,omitempty"`
	// +optional
	Snapshot *DataVolumeSourceSnapshot `json:"snapshot,omitempty"`
	// +optional
	DataSource *DataSourceRefSourceDataSource `json:"dataSource,omitempty"`
}

// DataSourceStatus is the resolved source and the Ready condition.
type DataSourceStatus struct {
	// +optional
	Source DataSourceSource `json:"source,omitempty"`
	// +optional
	Conditions []DataSourceCondition `json:"conditions,omitempty" optional:"true"`
}

// DataSourceCondition is a condition of a DataSource.
type DataSourceCondition struct {
	Type           DataSourceConditionType `json:"type"`
	ConditionState `json:",inline"`
}

// DataSourceConditionType names a DataSource condition.
type DataSourceConditionType string

// DataSourceReady says whether the DataSource's source can be used.
const DataSourceReady DataSourceConditionType = "Ready"

// ConditionState is the state shared by CDI's condition types.
type ConditionState struct {
	Status corev1.ConditionStatus `json:"status"`
	// +optional
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
	// +optional
	LastHeartbeatTime metav1.Time `json:"lastHeartbeatTime,omitempty"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}

// DataSourceList is a list of DataSources.
//
// +kubebuilder:object:root=true
type DataSourceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []DataSource `json:"items"`
}
