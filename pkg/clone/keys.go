package clone

// Wire strings the clone path needs that the API module does not define yet
// (they belong in kubefill-api's keys.go; until then they live here).
const (
	// annDataSourceNamespace on a target claim names the namespace of its
	// VolumeCloneSource, marking a cross-namespace clone.
	annDataSourceNamespace = "cdi.kubevirt.io/dataSourceNamespace"
	// annSnapshotSourceVolumeMode on a VolumeSnapshot is CDI's hint of the
	// source's volume mode, for snapshot contents without spec.sourceVolumeMode.
	annSnapshotSourceVolumeMode = "cdi.kubevirt.io/storage.import.sourceVolumeMode"
	// annDefaultSnapshotClass marks the default VolumeSnapshotClass of a
	// driver; the external snapshotter and CDI read this exact key.
	annDefaultSnapshotClass = "snapshot.storage.kubernetes.io/is-default-class"
)

// Fallback reasons (event reasons) and CDI's messages for them (the value of
// cdi.kubevirt.io/cloneFallbackReason). The API module has the first four
// reasons but neither NoProvisionerMatch nor the messages.
const (
	reasonNoVolumeSnapshotClass    = "NoVolumeSnapshotClass"
	reasonIncompatibleProvisioners = "IncompatibleProvisioners"
	reasonIncompatibleVolumeModes  = "IncompatibleVolumeModes"
	reasonNoVolumeExpansion        = "NoVolumeExpansion"
	reasonNoProvisionerMatch       = "NoProvisionerMatch"

	messageNoVolumeSnapshotClass    = "No compatible volumesnapshotclass found"
	messageIncompatibleProvisioners = "Provisioners are incompatible"
	messageIncompatibleVolumeModes  = "The volume modes of source and target are incompatible"
	messageNoVolumeExpansion        = "No volume expansion is possible"
	messageNoProvisionerMatch       = "The storageclass provisioner does not match the volumesnapshotcontent driver"
)

// Event reasons of the planner, CDI's.
const (
	// EventVolumeSnapshotClassSelected (Normal) names the class a snapshot clone uses.
	EventVolumeSnapshotClassSelected = "VolumeSnapshotClassSelected"
	// EventIncompatiblePVC (Warning) says the target cannot hold the source.
	EventIncompatiblePVC = "ErrIncompatiblePVC"
	// EventCloneValidationFailed (Warning) goes with EventIncompatiblePVC.
	EventCloneValidationFailed = "CloneValidationFailed"
	// MessageCloneValidationFailed is CDI's text of EventCloneValidationFailed.
	MessageCloneValidationFailed = "The clone doesn't meet the validation requirements"
)
