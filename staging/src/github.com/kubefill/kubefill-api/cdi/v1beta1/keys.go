package v1beta1

// Annotation and label keys on the wire. Clients such as KubeVirt and virtctl
// read and write these exact strings, so they are CDI's, unchanged.

// annPrefix is the prefix of every cdi.kubevirt.io annotation.
const annPrefix = GroupName + "/"

// Population: how a claim is, or was, filled.
const (
	// AnnUsePopulator on a DataVolume says its claim is filled by a populator.
	AnnUsePopulator = annPrefix + "storage.usePopulator"
	// AnnPopulatorKind on a PVC-prime names the populator kind that fills it.
	AnnPopulatorKind = annPrefix + "storage.populator.kind"
	// AnnPopulatorProgress on a target PVC is the transfer's progress, e.g. "45.20%".
	AnnPopulatorProgress = annPrefix + "storage.populator.progress"
	// AnnPVCPrimeName on a target PVC names its PVC-prime.
	AnnPVCPrimeName = annPrefix + "storage.populator.pvcPrime"
	// AnnPopulatedFor on a PV or PVC names the claim it was populated for.
	AnnPopulatedFor = annPrefix + "storage.populatedFor"
	// AnnPrePopulated on a PVC says it already holds its data.
	AnnPrePopulated = annPrefix + "storage.prePopulated"
	// AnnImmediateBinding asks to bind without waiting for a first consumer.
	AnnImmediateBinding = annPrefix + "storage.bind.immediate.requested"
	// AnnCreatedBy marks objects created by the controller for a claim.
	AnnCreatedBy = annPrefix + "storage.createdByController"
	// AnnDeleteAfterCompletion asks to delete the DataVolume once it succeeds.
	AnnDeleteAfterCompletion = annPrefix + "storage.deleteAfterCompletion"
	// AnnExternalPopulation marks a claim filled by someone else.
	AnnExternalPopulation = annPrefix + "externalPopulation"
	// AnnCheckStaticVolume asks to bind a matching static PV instead of filling one.
	AnnCheckStaticVolume = annPrefix + "storage.checkStaticVolume"
	// AnnAllowClaimAdoption allows a DataVolume to adopt an existing claim of its name.
	AnnAllowClaimAdoption = annPrefix + "allowClaimAdoption"
	// AnnOwnerUID holds the UID of an object's logical owner.
	AnnOwnerUID = annPrefix + "ownerUID"
)

// CDIConfig spec.featureGates that Kubefill reads. As in CDI, a gate is on
// only when its name is listed.
const (
	// FeatureGateHonorWaitForFirstConsumer: claims on a WaitForFirstConsumer
	// class wait for their consumer. Without it every new claim is bound at
	// once (AnnImmediateBinding). CDI's release CDI resource lists it.
	FeatureGateHonorWaitForFirstConsumer = "HonorWaitForFirstConsumer"
	// FeatureGateDataVolumeClaimAdoption: a DataVolume without
	// AnnAllowClaimAdoption adopts an existing claim of its name.
	FeatureGateDataVolumeClaimAdoption = "DataVolumeClaimAdoption"
)

// Worker pod state, mirrored onto the claim.
const (
	AnnPodPhase                 = annPrefix + "storage.pod.phase"
	AnnPodReady                 = annPrefix + "storage.pod.ready"
	AnnPodRestarts              = annPrefix + "storage.pod.restarts"
	AnnPodRetainAfterCompletion = annPrefix + "storage.pod.retainAfterCompletion"
	AnnPriorityClassName        = annPrefix + "storage.pod.priorityclassname"
)

// Worker pod networks and service meshes: a DataVolume's values reach its
// claim, the prime and the worker pods; where the user gives no mesh value,
// the worker pods opt out of the mesh with the default.
const (
	// AnnPodNetwork lists Multus secondary networks for the worker pods.
	AnnPodNetwork = "k8s.v1.cni.cncf.io/networks"
	// AnnPodMultusDefaultNetwork replaces the worker pods' default network.
	AnnPodMultusDefaultNetwork = "v1.multus-cni.io/default-network"
	// AnnPodSidecarInjectionIstio enables or disables an Istio sidecar.
	AnnPodSidecarInjectionIstio        = "sidecar.istio.io/inject"
	AnnPodSidecarInjectionIstioDefault = "false"
	// AnnPodSidecarInjectionLinkerd enables or disables a Linkerd proxy.
	AnnPodSidecarInjectionLinkerd        = "linkerd.io/inject"
	AnnPodSidecarInjectionLinkerdDefault = "disabled"
)

// Conditions, mirrored onto the claim for the DataVolume to read.
const (
	AnnRunningCondition        = annPrefix + "storage.condition.running"
	AnnRunningConditionReason  = annPrefix + "storage.condition.running.reason"
	AnnRunningConditionMessage = annPrefix + "storage.condition.running.message"
	AnnBoundCondition          = annPrefix + "storage.condition.bound"
	AnnBoundConditionReason    = annPrefix + "storage.condition.bound.reason"
	AnnBoundConditionMessage   = annPrefix + "storage.condition.bound.message"
)

// Import.
const (
	AnnSource                 = annPrefix + "storage.import.source"
	AnnEndpoint               = annPrefix + "storage.import.endpoint"
	AnnSecret                 = annPrefix + "storage.import.secretName"
	AnnCertConfigMap          = annPrefix + "storage.import.certConfigMap"
	AnnChecksum               = annPrefix + "storage.import.checksum"
	AnnExtraHeaders           = annPrefix + "storage.import.extraHeaders"
	AnnSecretExtraHeaders     = annPrefix + "storage.import.secretExtraHeaders"
	AnnRegistryImportMethod   = annPrefix + "storage.import.registryImportMethod"
	AnnRegistryImageStream    = annPrefix + "storage.import.registryImageStream"
	AnnImportPod              = annPrefix + "storage.import.importPodName"
	AnnRequiresScratch        = annPrefix + "storage.import.requiresScratch"
	AnnContentType            = annPrefix + "storage.contentType"
	AnnPreallocationRequested = annPrefix + "storage.preallocation.requested"
	AnnPreallocationApplied   = annPrefix + "storage.preallocation"
)

// The values of AnnSource.
const (
	SourceHTTP     = "http"
	SourceS3       = "s3"
	SourceGCS      = "gcs"
	SourceRegistry = "registry"
	SourceImageio  = "imageio"
	SourceVDDK     = "vddk"
	SourceNone     = "none"
)

// Upload.
const (
	// AnnUploadRequest marks a claim that accepts an upload.
	AnnUploadRequest = annPrefix + "storage.upload.target"
)

// Clone.
const (
	AnnCloneToken          = annPrefix + "storage.clone.token"
	AnnExtendedCloneToken  = annPrefix + "storage.extended.clone.token"
	AnnCloneType           = annPrefix + "cloneType"
	AnnClonePhase          = annPrefix + "clonePhase"
	AnnCloneError          = annPrefix + "cloneError"
	AnnCloneFallbackReason = annPrefix + "cloneFallbackReason"
	AnnPermissiveClone     = annPrefix + "permissiveClone"
	AnnCloneSourcePod      = annPrefix + "storage.sourceClonePodName"
	// AnnCloneStrategy on a StorageClass overrides its profile's clone strategy.
	AnnCloneStrategy = annPrefix + "clone-strategy"
	// AnnDataSourceNamespace on a target claim names the namespace of its
	// VolumeCloneSource, marking a cross-namespace clone.
	AnnDataSourceNamespace = annPrefix + "dataSourceNamespace"
	// AnnSnapshotSourceVolumeMode on a VolumeSnapshot is CDI's hint of the
	// source's volume mode, for contents without spec.sourceVolumeMode.
	AnnSnapshotSourceVolumeMode = annPrefix + "storage.import.sourceVolumeMode"
	// AnnCloneRequest on a host-assisted clone's claim names its source, <ns>/<name>.
	AnnCloneRequest = "k8s.io/CloneRequest"
	// AnnCloneOf on a claim says a host-assisted clone filled it.
	AnnCloneOf = "k8s.io/CloneOf"
	// AnnUploadClientName names the client certificate a clone's upload
	// server accepts: <srcNs>/<srcName>-<tgtNs>/<tgtName>.
	AnnUploadClientName = annPrefix + "uploadClientName"
	// FinalizerClonePopulator on a clone's target lets the populator remove
	// its temporary objects in the source namespace, which owner references
	// cannot reach.
	FinalizerClonePopulator = annPrefix + "clonePopulator"
	// AnnOwnedByDataVolume on a VolumeCloneSource in another namespace names
	// the DataVolume it serves, <ns>/<name>: owner references cannot cross
	// namespaces.
	AnnOwnedByDataVolume = annPrefix + "ownedByDataVolume"
	// FinalizerDataVolume on a cross-namespace clone DataVolume lets the
	// controller delete its VolumeCloneSource in the source namespace.
	FinalizerDataVolume = annPrefix + "dataVolumeFinalizer"
)

// Clone fallback reasons (Warning event reasons) and CDI's messages for them,
// the value of cdi.kubevirt.io/cloneFallbackReason.
const (
	FallbackNoVolumeSnapshotClass    = "NoVolumeSnapshotClass"
	FallbackIncompatibleProvisioners = "IncompatibleProvisioners"
	FallbackIncompatibleVolumeModes  = "IncompatibleVolumeModes"
	FallbackNoVolumeExpansion        = "NoVolumeExpansion"
	FallbackNoProvisionerMatch       = "NoProvisionerMatch"

	FallbackMessageNoVolumeSnapshotClass    = "No compatible volumesnapshotclass found"
	FallbackMessageIncompatibleProvisioners = "Provisioners are incompatible"
	FallbackMessageIncompatibleVolumeModes  = "The volume modes of source and target are incompatible"
	FallbackMessageNoVolumeExpansion        = "No volume expansion is possible"
	FallbackMessageNoProvisionerMatch       = "The storageclass provisioner does not match the volumesnapshotcontent driver"
)

// Events raised on a temporary object but meant for the user's object.
const (
	AnnEventSourceKind = annPrefix + "events.source.kind"
	AnnEventSource     = annPrefix + "events.source"
)

// Keys Kubernetes itself defines that Kubefill reads.
const (
	AnnSelectedNode            = "volume.kubernetes.io/selected-node"
	AnnDefaultStorageClass     = "storageclass.kubernetes.io/is-default-class"
	AnnDefaultVirtStorageClass = "storageclass.kubevirt.io/is-default-virt-class"
	// AnnDefaultSnapshotClass marks a driver's default VolumeSnapshotClass;
	// the external snapshotter and CDI read this exact key.
	AnnDefaultSnapshotClass = "snapshot.storage.kubernetes.io/is-default-class"
)

// Labels on the temporary objects Kubefill creates.
const (
	// LabelOwnedByUID ties a temporary object to the UID of the claim it serves.
	LabelOwnedByUID = annPrefix + "OwnedByUID"
	// LabelApp and LabelAppValue mark every object Kubefill creates, as CDI's "app" label does.
	LabelApp      = "app"
	LabelAppValue = "containerized-data-importer"
	// LabelComponent names the worker kind, e.g. "importer", as CDI's component label does.
	LabelComponent = GroupName
	// Recommended Kubernetes labels.
	LabelAppName      = "app.kubernetes.io/name"
	LabelAppComponent = "app.kubernetes.io/component"
	LabelAppPartOf    = "app.kubernetes.io/part-of"
	LabelAppManagedBy = "app.kubernetes.io/managed-by"
	// LabelApplyStorageProfile on a PVC asks for it to be completed from its StorageProfile.
	LabelApplyStorageProfile = annPrefix + "applyStorageProfile"
	// LabelAllowAccessClusterServices on a worker pod lets it reach cluster
	// services (the API server, a registry or HTTP server in the cluster)
	// where a KubeVirt network policy denies egress by default; CDI's worker
	// pods carry it with the value "true".
	LabelAllowAccessClusterServices = "np.kubevirt.io/allow-access-cluster-services"
	// LabelExcludeFromVeleroBackup keeps a temporary claim (scratch space)
	// out of Velero backups, as CDI marks its scratch claims.
	LabelExcludeFromVeleroBackup = "velero.io/exclude-from-backup"
)

// Condition reasons a DataVolume reports.
const (
	ReasonBound           = "Bound"
	ReasonPending         = "Pending"
	ReasonClaimLost       = "ClaimLost"
	ReasonNotFound        = "NotFound"
	ReasonTransferRunning = "TransferRunning"
	ReasonCompleted       = "Completed"
	ReasonError           = "Error"
	// ReasonImagePullFailed: a registry source's image, or the worker's own
	// image, cannot be pulled (KubeVirt shows DataVolumeError for it).
	ReasonImagePullFailed = "ImagePullFailed"
)

// DataImportCron: the annotations the cron and its poller keep on the cron,
// and the keys on the objects a cron creates.
const (
	// AnnSourceDesiredDigest on a cron is the digest to import, written by
	// the poller (registry sources) or the controller (pvc sources).
	AnnSourceDesiredDigest = annPrefix + "storage.import.sourceDesiredDigest"
	// AnnImageStreamDockerRef on a cron is the docker reference of an
	// ImageStream source's newest image.
	AnnImageStreamDockerRef = annPrefix + "storage.import.imageStreamDockerRef"
	// AnnNextCronTime on a cron is the next poll time (RFC3339).
	AnnNextCronTime = annPrefix + "storage.import.nextCronTime"
	// AnnLastCronTime on a cron is the last poll time (RFC3339).
	AnnLastCronTime = annPrefix + "storage.import.lastCronTime"
	// AnnLastUseTime on an import's DataVolume, claim or snapshot is when the
	// cron last used it (RFC3339Nano); garbage collection keeps the newest.
	AnnLastUseTime = annPrefix + "storage.import.lastUseTime"
	// AnnStorageClass on a cron is the storage class of its last import.
	AnnStorageClass = annPrefix + "storage.import.storageClass"

	// LabelDataImportCron on a DataVolume, claim, snapshot or DataSource
	// names the cron that created or manages it.
	LabelDataImportCron = annPrefix + "dataImportCron"
	// LabelDataImportCronNs on a poller CronJob or Job names the cron's namespace.
	LabelDataImportCronNs = annPrefix + "dataImportCronNs"
	// LabelDataImportCronCleanup ("true") marks what a cron with
	// retentionPolicy None deletes with it.
	LabelDataImportCronCleanup = annPrefix + "dataImportCron.cleanup"
)

// Labels KubeVirt defines that a cron copies onto its imports and that reach
// a DataSource; KubeVirt's instancetype inference reads the four defaults.
const (
	LabelDefaultInstancetype     = "instancetype.kubevirt.io/default-instancetype"
	LabelDefaultInstancetypeKind = "instancetype.kubevirt.io/default-instancetype-kind"
	LabelDefaultPreference       = "instancetype.kubevirt.io/default-preference"
	LabelDefaultPreferenceKind   = "instancetype.kubevirt.io/default-preference-kind"
	// LabelDynamicCredentialSupport marks an image whose guest supports
	// KubeVirt's dynamic credential injection.
	LabelDynamicCredentialSupport = "kubevirt.io/dynamic-credentials-support"
)

// The CDI resource.
const (
	// AnnConfigAuthority on the CDI resource makes its spec.config the
	// CDIConfig's spec (set by the operator on first reconcile).
	AnnConfigAuthority = annPrefix + "configAuthority"
	// FinalizerCDIOperator is the operator's finalizer on the CDI resource.
	FinalizerCDIOperator = "operator.cdi.kubevirt.io"
	// CDIOperatorConfigMap is the ConfigMap in the install namespace that
	// the honoured CDI resource owns as controller; any other CDI resource
	// goes to phase Error.
	CDIOperatorConfigMap = "cdi-config"
	// LabelCDIOperator marks that ConfigMap, as CDI's operator does.
	LabelCDIOperator = "operator.cdi.kubevirt.io"
	// DefaultInfraPriorityClass is the control plane's priority class when
	// the CDI resource names none and the class exists (KubeVirt makes it).
	DefaultInfraPriorityClass = "kubevirt-cluster-critical"
	// AnnManifestPlacement is Kubefill's own: on an install Deployment whose
	// pod placement, replicas, priority class or pull policy the CDI
	// resource changed, the manifest's values of those fields (JSON), put
	// back once the CDI resource no longer sets them.
	AnnManifestPlacement = "kubefill.io/manifest-placement"
)
