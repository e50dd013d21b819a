package v1beta1

// The phases of a CDI resource, as CDI's operator (the controller lifecycle
// operator SDK) spells them.
const (
	CDIPhaseEmpty     CDIPhase = ""
	CDIPhaseDeploying CDIPhase = "Deploying"
	CDIPhaseDeployed  CDIPhase = "Deployed"
	CDIPhaseUpgrading CDIPhase = "Upgrading"
	CDIPhaseDeleting  CDIPhase = "Deleting"
	CDIPhaseDeleted   CDIPhase = "Deleted"
	CDIPhaseError     CDIPhase = "Error"
)

// The condition types of a CDI resource (openshift/custom-resource-status).
const (
	CDIConditionAvailable   = "Available"
	CDIConditionProgressing = "Progressing"
	CDIConditionDegraded    = "Degraded"
)

// The condition reasons and messages CDI's operator sets, which the
// hyperconverged operator and users read.
const (
	CDIReasonDeployStarted    = "DeployStarted"
	CDIMessageDeployStarted   = "Started Deployment"
	CDIReasonDeployCompleted  = "DeployCompleted"
	CDIMessageDeployCompleted = "Deployment Completed"
	CDIReasonUpgradeStarted   = "UpgradeStarted"
	// CDIMessageUpgradeStarted takes the target version.
	CDIMessageUpgradeStarted = "Started upgrade to version %s"
	CDIReasonConfigError     = "ConfigError"
	// CDIMessageUnwanted is the ConfigError of every CDI resource but the
	// one that claimed the install (CDI's exact words).
	CDIMessageUnwanted = "Reconciling to error state, unwanted CDI object"
)
