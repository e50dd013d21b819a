package clone

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
