// Package clone decides how a clone runs. Plan is pure: from the source (a
// claim or a VolumeSnapshot), the target claim, their StorageClasses and
// StorageProfiles, the CDI override and the VolumeSnapshotClasses, all read
// by the caller, it picks the snapshot, CSI-clone or host-assisted strategy
// the way CDI's planner does, says why it fell back and what would enable
// the faster strategy, sizes a sizeless target, refuses what cannot work,
// and lists the phases to run. phases.go maps the target's clonePhase to the
// DataVolume's phase and Running condition. The phases themselves, each a
// small type with a Reconcile, land with the clone issue on the populator
// base.
package clone
