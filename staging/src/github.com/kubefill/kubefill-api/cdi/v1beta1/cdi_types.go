package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CDI is the install resource: one per cluster, configuring the deployment
// and the cluster-wide defaults.
//
// +kubebuilder:object:root=true
// +kubebuilder:storageversion
// +kubebuilder:resource:shortName=cdi;cdis,scope=Cluster
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="Phase",type="string",JSONPath=".status.phase"
type CDI struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec CDISpec `json:"spec"`
	// +optional
	Status CDIStatus `json:"status"`
}

// CDISpec configures the installation.
type CDISpec struct {
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// +kubebuilder:validation:Enum=RemoveWorkloads;BlockUninstallIfWorkloadsExist
	// +optional
	UninstallStrategy *CDIUninstallStrategy `json:"uninstallStrategy,omitempty"`
	// Infra places the control-plane components.
	// +optional
	Infra ComponentConfig `json:"infra,omitempty"`
	// Workloads places the worker pods (importer, uploader, cloner).
	// +optional
	Workloads NodePlacement `json:"workload,omitempty"`
	// +optional
	CustomizeComponents CustomizeComponents `json:"customizeComponents,omitempty"`
	// CloneStrategyOverride wins over every StorageProfile's clone strategy.
	// +kubebuilder:validation:Enum="copy";"snapshot";"csi-clone"
	// +optional
	CloneStrategyOverride *CDICloneStrategy `json:"cloneStrategyOverride,omitempty"`
	// Config is copied into the CDIConfig's spec.
	// +optional
	Config *CDIConfigSpec `json:"config,omitempty"`
	// +optional
	CertConfig *CDICertConfig `json:"certConfig,omitempty"`
	// +optional
	PriorityClass *CDIPriorityClass `json:"priorityClass,omitempty"`
}

// NodePlacement is where a set of pods may run.
type NodePlacement struct {
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
}

// ComponentConfig places the control-plane components and sets replicas.
type ComponentConfig struct {
	NodePlacement `json:",inline"`
	// +optional
	DeploymentReplicas *int32 `json:"deploymentReplicas,omitempty"`
	// +optional
	APIServerReplicas *int32 `json:"apiServerReplicas,omitempty"`
	// +optional
	UploadProxyReplicas *int32 `json:"uploadProxyReplicas,omitempty"`
}

// CertConfig sets a certificate's lifetime and when to renew it.
type CertConfig struct {
	// +optional
	Duration *metav1.Duration `json:"duration,omitempty"`
	// +optional
	RenewBefore *metav1.Duration `json:"renewBefore,omitempty"`
}

// CDICertConfig sets the lifetimes of the CA, server and client certificates.
type CDICertConfig struct {
	// +optional
	CA *CertConfig `json:"ca,omitempty"`
	// +optional
	Server *CertConfig `json:"server,omitempty"`
	// +optional
	Client *CertConfig `json:"client,omitempty"`
}

// CDIPriorityClass is the priority class of the control plane.
type CDIPriorityClass string

// CustomizeComponents patches the deployed components.
type CustomizeComponents struct {
	// +listType=atomic
	// +optional
	Patches []CustomizeComponentsPatch `json:"patches,omitempty"`
	// +optional
	Flags *Flags `json:"flags,omitempty"`
}

// Flags replaces the command-line flags of a component.
type Flags struct {
	// +optional
	API map[string]string `json:"api,omitempty"`
	// +optional
	Controller map[string]string `json:"controller,omitempty"`
	// +optional
	UploadProxy map[string]string `json:"uploadProxy,omitempty"`
}

// CustomizeComponentsPatch is one patch to one deployed resource.
type CustomizeComponentsPatch struct {
	// +kubebuilder:validation:MinLength=1
	ResourceName string `json:"resourceName"`
	// +kubebuilder:validation:MinLength=1
	ResourceType string    `json:"resourceType"`
	Patch        string    `json:"patch"`
	Type         PatchType `json:"type"`
}

// PatchType is "json", "merge" or "strategic".
type PatchType string

// The patch types.
const (
	JSONPatchType           PatchType = "json"
	MergePatchType          PatchType = "merge"
	StrategicMergePatchType PatchType = "strategic"
)

// CDIUninstallStrategy says what uninstalling leaves behind.
type CDIUninstallStrategy string

// The uninstall strategies.
const (
	CDIUninstallStrategyRemoveWorkloads                CDIUninstallStrategy = "RemoveWorkloads"
	CDIUninstallStrategyBlockUninstallIfWorkloadsExist CDIUninstallStrategy = "BlockUninstallIfWorkloadsExist"
)

// CDIPhase is the installation's phase, e.g. "Deployed".
type CDIPhase string

// CDIStatus is the installation's state, in the operator-SDK shape CDI uses.
type CDIStatus struct {
	// +optional
	Phase CDIPhase `json:"phase,omitempty"`
	// +optional
	Conditions []OperatorCondition `json:"conditions,omitempty" optional:"true"`
	// +optional
	OperatorVersion string `json:"operatorVersion,omitempty"`
	// +optional
	TargetVersion string `json:"targetVersion,omitempty"`
	// +optional
	ObservedVersion string `json:"observedVersion,omitempty"`
}

// OperatorCondition is an operator condition such as Available, Progressing or Degraded.
type OperatorCondition struct {
	Type   string                 `json:"type"`
	Status corev1.ConditionStatus `json:"status"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	LastHeartbeatTime metav1.Time `json:"lastHeartbeatTime,omitempty"`
	// +optional
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
}

// CDIList is a list of CDIs.
//
// +kubebuilder:object:root=true
type CDIList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata"`
	Items           []CDI `json:"items"`
}
