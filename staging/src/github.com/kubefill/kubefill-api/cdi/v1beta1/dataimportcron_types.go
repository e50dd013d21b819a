package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DataImportCron polls a source (a registry image, or a PVC) on a cron
// schedule, imports each new version into a DataVolume made from its
// template, keeps the last few, and points its managed DataSource at the
// newest.
//
// +kubebuilder:object:root=true
// +kubebuilder:storageversion
// +kubebuilder:resource:shortName=dic;dics,categories=all
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Format",type="string",JSONPath=".status.sourceFormat",description="The format in which created sources are saved"
type DataImportCron struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   DataImportCronSpec   `json:"spec"`
	Status DataImportCronStatus `json:"status,omitempty"`
}

// DataImportCronSpec is the cron's template, schedule and retention.
type DataImportCronSpec struct {
	// Template is the DataVolume each import is made from. Its source is
	// spec.source.registry or spec.source.pvc.
	Template DataVolume `json:"template"`
	// Schedule is a standard 5-field cron expression saying when to look for
	// a new version of the source; empty disables polling.
	Schedule string `json:"schedule"`
	// GarbageCollect says whether outdated imports are removed after a new
	// one succeeds: "Outdated" (the default) or "Never".
	// +kubebuilder:validation:Enum=Outdated;Never
	// +optional
	GarbageCollect *DataImportCronGarbageCollect `json:"garbageCollect,omitempty"`
	// ImportsToKeep is how many imports garbage collection keeps. Default 3.
	// +optional
	ImportsToKeep *int32 `json:"importsToKeep,omitempty"`
	// ManagedDataSource names the DataSource, in the cron's namespace, that
	// the cron points at its newest import.
	ManagedDataSource string `json:"managedDataSource"`
	// RetentionPolicy says whether the DataVolumes and DataSource the cron
	// created stay when it is deleted: "All" (the default when unset) or "None".
	// +kubebuilder:validation:Enum=None;All
	// +optional
	RetentionPolicy *DataImportCronRetentionPolicy `json:"retentionPolicy,omitempty"`
	// ServiceAccountName is the ServiceAccount, in the cron's namespace,
	// whose rights a pvc source is cloned with: it must be allowed to clone
	// the source claim (create datavolumes/source, or create pods, in the
	// claim's namespace). Unset: the namespace's "default" ServiceAccount.
	// +optional
	// +kubebuilder:validation:MinLength=1
	ServiceAccountName *string `json:"serviceAccountName,omitempty"`
}

// DefaultDataImportCronServiceAccount is the ServiceAccount a cron without
// spec.serviceAccountName clones its pvc source as, as in CDI.
const DefaultDataImportCronServiceAccount = "default"

// CloneServiceAccount is the name of the ServiceAccount, in the cron's
// namespace, whose rights the cron's pvc source is cloned with.
func (c *DataImportCron) CloneServiceAccount() string {
	if c.Spec.ServiceAccountName != nil && *c.Spec.ServiceAccountName != "" {
		return *c.Spec.ServiceAccountName
	}
	return DefaultDataImportCronServiceAccount
}

// DataImportCronGarbageCollect is the garbage collection mode of a cron.
type DataImportCronGarbageCollect string

const (
	// DataImportCronGarbageCollectNever keeps every import.
	DataImportCronGarbageCollectNever DataImportCronGarbageCollect = "Never"
	// DataImportCronGarbageCollectOutdated removes imports past importsToKeep
	// after a new import succeeds.
	DataImportCronGarbageCollectOutdated DataImportCronGarbageCollect = "Outdated"
)

// DataImportCronRetentionPolicy says what happens to a cron's imports and
// DataSource when the cron is deleted.
type DataImportCronRetentionPolicy string

const (
	// DataImportCronRetainNone deletes the cron's DataVolumes, claims,
	// snapshots and DataSource with it.
	DataImportCronRetainNone DataImportCronRetentionPolicy = "None"
	// DataImportCronRetainAll keeps them.
	DataImportCronRetainAll DataImportCronRetentionPolicy = "All"
)

// DataImportCronStatus is what the cron last saw and did.
type DataImportCronStatus struct {
	// CurrentImports are the imports in progress; only the first is used.
	// +optional
	CurrentImports []ImportStatus `json:"currentImports,omitempty"`
	// LastImportedPVC is the newest import that succeeded.
	// +optional
	LastImportedPVC *DataVolumeSourcePVC `json:"lastImportedPVC,omitempty"`
	// LastExecutionTimestamp is the time of the last poll.
	// +optional
	LastExecutionTimestamp *metav1.Time `json:"lastExecutionTimestamp,omitempty"`
	// LastImportTimestamp is the time lastImportedPVC last changed.
	// +optional
	LastImportTimestamp *metav1.Time `json:"lastImportTimestamp,omitempty"`
	// SourceFormat is how the imports are kept: "pvc" or "snapshot".
	// +optional
	SourceFormat *DataImportCronSourceFormat `json:"sourceFormat,omitempty"`
	// +optional
	Conditions []DataImportCronCondition `json:"conditions,omitempty" optional:"true"`
}

// ImportStatus is one import in progress. The capitalised JSON keys are CDI's.
type ImportStatus struct {
	// DataVolumeName names the import's DataVolume.
	DataVolumeName string `json:"DataVolumeName"`
	// Digest is the digest of the imported version of the source.
	Digest string `json:"Digest"`
}

// DataImportCronCondition is a condition of a DataImportCron.
type DataImportCronCondition struct {
	Type           DataImportCronConditionType `json:"type"`
	ConditionState `json:",inline"`
}

// DataImportCronConditionType names a DataImportCron condition.
type DataImportCronConditionType string

const (
	// DataImportCronProgressing says whether an import is running.
	DataImportCronProgressing DataImportCronConditionType = "Progressing"
	// DataImportCronUpToDate says whether the newest import matches the
	// source's current digest.
	DataImportCronUpToDate DataImportCronConditionType = "UpToDate"
)

// DataImportCronList is a list of DataImportCrons.
//
// +kubebuilder:object:root=true
type DataImportCronList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []DataImportCron `json:"items"`
}
