package clone

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// Input is everything Plan needs, already read by the caller. Exactly one of
// SourceClaim and SourceSnapshot is set.
type Input struct {
	SourceClaim    *SourceClaim
	SourceSnapshot *SourceSnapshot

	// Target is the user's claim: its request (absent or zero for a sizeless
	// clone), volumeMode, storageClassName and annotations (cloneType,
	// permissiveClone, contentType).
	Target *corev1.PersistentVolumeClaim
	// TargetClass is the target's StorageClass; the caller waits for it.
	TargetClass *storagev1.StorageClass
	// TargetProfile is the status of the StorageProfile named after the
	// target's class; nil when there is none.
	TargetProfile *cdiv1.StorageProfileStatus
	// CloneStrategyOverride is the CDI CR's spec.cloneStrategyOverride.
	CloneStrategyOverride *cdiv1.CDICloneStrategy
	// SnapshotClasses are the cluster's VolumeSnapshotClasses.
	SnapshotClasses []SnapshotClass
	// FilesystemOverhead is the share of a Filesystem volume of the target's
	// class kept for the filesystem (CDIConfig status), from 0 to 1.
	FilesystemOverhead float64
	// ContentType is the clone's content; "" reads the target's
	// cdi.kubevirt.io/storage.contentType, then defaults to kubevirt.
	ContentType cdiv1.DataVolumeContentType
}

// SourceClaim is a source PersistentVolumeClaim with what Plan needs about
// its volume.
type SourceClaim struct {
	// Claim gives spec (request, volumeMode, storageClassName) and
	// status.capacity.
	Claim *corev1.PersistentVolumeClaim
	// Class is the claim's StorageClass; nil when it has none or it is gone.
	Class *storagev1.StorageClass
	// Profile is the status of the StorageProfile of Class; nil when none.
	Profile *cdiv1.StorageProfileStatus
	// PVDriver is the bound PV's spec.csi.driver; "" when not CSI or unbound.
	PVDriver string
}

// SourceSnapshot is a source VolumeSnapshot with what Plan needs about its
// VolumeSnapshotContent.
type SourceSnapshot struct {
	// RestoreSize is status.restoreSize; nil until the snapshot reports it.
	RestoreSize *resource.Quantity
	// ContentDriver is the VolumeSnapshotContent's spec.driver.
	ContentDriver string
	// SourceVolumeMode is the content's spec.sourceVolumeMode, else the
	// snapshot's cdi.kubevirt.io/storage.import.sourceVolumeMode; nil when
	// neither says.
	SourceVolumeMode *corev1.PersistentVolumeMode
}

// Decision is how the clone runs.
type Decision struct {
	Strategy cdiv1.CDICloneStrategy
	// StrategyFrom says where the strategy asked for came from (before any
	// fallback), for logs and events.
	StrategyFrom string
	// Pinned is set when the target's cdi.kubevirt.io/cloneType decided:
	// nothing else was consulted, so nothing is reported as a fallback.
	Pinned bool

	// FallbackReason is CDI's short reason (the Warning event's reason) when
	// a faster strategy fell back to copy; "" otherwise.
	FallbackReason string
	// FallbackMessage is CDI's text for the reason, the value of
	// cdi.kubevirt.io/cloneFallbackReason.
	FallbackMessage string
	// Hint says what would enable the faster strategy (Kubefill's addition,
	// for the event and the condition).
	Hint string

	// SnapshotClass is the VolumeSnapshotClass a PVC+snapshot clone uses. It
	// can be "" for a pinned snapshot clone whose class has since gone; the
	// Snapshot phase then waits, showing Hint.
	SnapshotClass string
	// SnapshotClassEvent is the message of the Normal event
	// EventVolumeSnapshotClassSelected; "" when no class was chosen.
	SnapshotClassEvent string

	// TargetSize is the size the target gets: its request, or for a sizeless
	// clone the source's size (inflated for filesystem overhead where a Block
	// source fills a Filesystem target).
	TargetSize resource.Quantity
	// Sizeless is set when the target gave no request.
	Sizeless bool

	// Phases are the phases to run, in order.
	Phases []PhaseName
}

// Refusal is a clone that cannot work as asked: the target is too small, or
// the volume modes differ for content that cannot cross them. The caller
// raises Event (and EventCloneValidationFailed) and sets the Error phase.
type Refusal struct {
	Event   string
	Message string
}

func (r *Refusal) Error() string { return r.Message }

// ErrSourceNotReady says the source lacks what planning needs (a claim's
// status.capacity, a snapshot's restoreSize); plan again when it changes.
var ErrSourceNotReady = errors.New("clone source not ready")

// Plan decides the clone's strategy, size and phases. It returns a *Refusal
// for a clone that cannot work, an error wrapping ErrSourceNotReady when the
// source is not ready, or another error for inconsistent input.
func Plan(in Input) (Decision, error) {
	if in.Target == nil || in.TargetClass == nil {
		return Decision{}, errors.New("clone plan needs the target claim and its StorageClass")
	}
	switch {
	case in.SourceClaim != nil && in.SourceSnapshot != nil:
		return Decision{}, errors.New("clone plan got both a source claim and a source snapshot")
	case in.SourceClaim != nil:
		if in.SourceClaim.Claim == nil {
			return Decision{}, errors.New("clone plan got a source without its claim")
		}
		return planFromClaim(in)
	case in.SourceSnapshot != nil:
		return planFromSnapshot(in)
	}
	return Decision{}, errors.New("clone plan needs a source claim or a source snapshot")
}

func planFromClaim(in Input) (Decision, error) {
	src := in.SourceClaim
	d, err := sizeTarget(in, func() (resource.Quantity, error) { return sizelessFromClaim(in) })
	if err != nil {
		return d, err
	}
	driver, driverNote := commonDriver(src, in.TargetClass)

	if pinned, ok := in.Target.Annotations[cdiv1.AnnCloneType]; ok {
		if err := pin(&d, pinned, phasesFromClaim); err != nil {
			return d, err
		}
		if d.Strategy == cdiv1.CloneStrategySnapshot {
			d.SnapshotClass, d.SnapshotClassEvent, d.Hint = ChooseSnapshotClass(driver, profileClass(src.Profile), profileClass(in.TargetProfile), in.SnapshotClasses)
			if d.SnapshotClass == "" && d.Hint == "" {
				d.Hint = noClassHint(driver, driverNote)
			}
		}
		return d, nil
	}

	if !permissive(in.Target) {
		if err := checkNotSmaller(d.TargetSize, claimRequest(src.Claim)); err != nil {
			return d, err
		}
	}

	d.Strategy, d.StrategyFrom = cdiv1.CloneStrategySnapshot, "default"
	if o := in.CloneStrategyOverride; o != nil {
		d.Strategy, d.StrategyFrom = *o, "CDI spec.cloneStrategyOverride"
	} else if p := in.TargetProfile; p != nil && p.CloneStrategy != nil {
		d.Strategy, d.StrategyFrom = *p.CloneStrategy, fmt.Sprintf("StorageProfile %s status.cloneStrategy", in.TargetClass.Name)
	}
	if _, ok := phasesFromClaim[d.Strategy]; !ok {
		return d, fmt.Errorf("unknown clone strategy %q from %s", d.Strategy, d.StrategyFrom)
	}

	if d.Strategy != cdiv1.CloneStrategyHostAssisted {
		if err := fallBackFromClaim(in, &d, driver, driverNote); err != nil {
			return d, err
		}
	}
	if d.Strategy == cdiv1.CloneStrategyHostAssisted {
		if err := checkCopy(in, volumeMode(src.Claim.Spec.VolumeMode), sourceBytes(src.Claim), d.TargetSize); err != nil {
			return d, err
		}
	}
	d.Phases = phasesFromClaim[d.Strategy]
	return d, nil
}

// fallBackFromClaim runs CDI's checks for a snapshot or CSI clone of a
// claim and falls back to copy at the first that fails. Kubefill checks the
// drivers before looking for a snapshot class: CDI looks for the class first
// and, across drivers, reports NoVolumeSnapshotClass, whose remedy (create a
// class) would not help.
func fallBackFromClaim(in Input, d *Decision, driver, driverNote string) error {
	src := in.SourceClaim
	if driver == "" {
		fallBack(d, cdiv1.FallbackIncompatibleProvisioners, driverNote+"; a snapshot or CSI clone needs source and target on the same CSI driver")
		return nil
	}
	if d.Strategy == cdiv1.CloneStrategySnapshot {
		d.SnapshotClass, d.SnapshotClassEvent, d.Hint = ChooseSnapshotClass(driver, profileClass(src.Profile), profileClass(in.TargetProfile), in.SnapshotClasses)
		if d.SnapshotClass == "" {
			hint := d.Hint
			if hint == "" {
				hint = noClassHint(driver, "")
			}
			fallBack(d, cdiv1.FallbackNoVolumeSnapshotClass, hint)
			return nil
		}
	}
	srcMode, tgtMode := volumeMode(src.Claim.Spec.VolumeMode), volumeMode(in.Target.Spec.VolumeMode)
	if srcMode != tgtMode {
		fallBack(d, cdiv1.FallbackIncompatibleVolumeModes, fmt.Sprintf(
			"the source is %s and the target %s; a %s clone keeps the volume mode, so give the target volumeMode %s for it", srcMode, tgtMode, d.Strategy, srcMode))
		return nil
	}
	// The temporary claim is made at the source's capacity; guessing it from
	// the request could pin the wrong strategy for good.
	capacity, ok := src.Claim.Status.Capacity[corev1.ResourceStorage]
	if !ok {
		return fmt.Errorf("%w: source claim %s has no status.capacity yet (is it Bound?)", ErrSourceNotReady, src.Claim.Name)
	}
	if capacity.Cmp(d.TargetSize) < 0 && !allowsExpansion(in.TargetClass) {
		fallBack(d, cdiv1.FallbackNoVolumeExpansion, fmt.Sprintf(
			"the target asks for %s, more than the source's %s, and StorageClass %s does not allow volume expansion; set allowVolumeExpansion: true on it, or ask for %s",
			d.TargetSize.String(), capacity.String(), in.TargetClass.Name, capacity.String()))
	}
	return nil
}

func planFromSnapshot(in Input) (Decision, error) {
	snap := in.SourceSnapshot
	if snap.RestoreSize == nil || snap.RestoreSize.Sign() < 0 {
		return Decision{}, fmt.Errorf("%w: the snapshot reports no status.restoreSize yet", ErrSourceNotReady)
	}
	d, err := sizeTarget(in, func() (resource.Quantity, error) { return sizelessFromSnapshot(in) })
	if err != nil {
		return d, err
	}
	if pinned, ok := in.Target.Annotations[cdiv1.AnnCloneType]; ok {
		return d, pin(&d, pinned, phasesFromSnapshot)
	}
	if !permissive(in.Target) && !snap.RestoreSize.IsZero() {
		if err := checkNotSmaller(d.TargetSize, *snap.RestoreSize); err != nil {
			return d, err
		}
	}

	// CDI consults neither the override nor the StorageProfile for a
	// snapshot source: restoring it is the fast path. Kubefill checks the
	// modes before the size, where CDI checks them last: across modes the
	// sizeless target is larger only because of the overhead, and asking
	// for expansion would not make a restore possible.
	d.Strategy, d.StrategyFrom = cdiv1.CloneStrategySnapshot, "snapshot source"
	tgtMode := volumeMode(in.Target.Spec.VolumeMode)
	switch {
	case snap.ContentDriver != in.TargetClass.Provisioner:
		fallBack(&d, cdiv1.FallbackNoProvisionerMatch, fmt.Sprintf(
			"the snapshot was taken by driver %q but StorageClass %s provisions with %q; restore it into a StorageClass of driver %q",
			snap.ContentDriver, in.TargetClass.Name, in.TargetClass.Provisioner, snap.ContentDriver))
	case volumeMode(snap.SourceVolumeMode) != tgtMode:
		srcMode := volumeMode(snap.SourceVolumeMode)
		fallBack(&d, cdiv1.FallbackIncompatibleVolumeModes, fmt.Sprintf(
			"the snapshot is of a %s volume and the target is %s; a restore keeps the volume mode, so give the target volumeMode %s for it", srcMode, tgtMode, srcMode))
	case !snap.RestoreSize.IsZero() && snap.RestoreSize.Cmp(d.TargetSize) < 0 && !allowsExpansion(in.TargetClass):
		// A zero restoreSize restores at the target's size, so it needs no expansion.
		fallBack(&d, cdiv1.FallbackNoVolumeExpansion, fmt.Sprintf(
			"the target asks for %s, more than the snapshot's restoreSize %s, and StorageClass %s does not allow volume expansion; set allowVolumeExpansion: true on it, or ask for %s",
			d.TargetSize.String(), snap.RestoreSize.String(), in.TargetClass.Name, snap.RestoreSize.String()))
	}

	if d.Strategy == cdiv1.CloneStrategyHostAssisted {
		// The copy reads a temporary restore made in the snapshot's own mode,
		// or in the target's when the snapshot does not say (as CDI does).
		srcMode := tgtMode
		if snap.SourceVolumeMode != nil {
			srcMode = *snap.SourceVolumeMode
		}
		if err := checkCopy(in, srcMode, *snap.RestoreSize, d.TargetSize); err != nil {
			return d, err
		}
	}
	d.Phases = phasesFromSnapshot[d.Strategy]
	return d, nil
}

// pin applies a strategy already recorded on the target: it was chosen
// once, and a StorageProfile or override edited since changes nothing.
func pin(d *Decision, value string, plans map[cdiv1.CDICloneStrategy][]PhaseName) error {
	phases, ok := plans[cdiv1.CDICloneStrategy(value)]
	if !ok {
		return fmt.Errorf("the target's %s is %q, which this source cannot be cloned by", cdiv1.AnnCloneType, value)
	}
	d.Strategy, d.StrategyFrom, d.Pinned = cdiv1.CDICloneStrategy(value), "target annotation "+cdiv1.AnnCloneType, true
	d.Phases = phases
	return nil
}

func fallBack(d *Decision, reason, hint string) {
	d.Strategy = cdiv1.CloneStrategyHostAssisted
	d.FallbackReason, d.FallbackMessage, d.Hint = reason, fallbackMessages[reason], hint
	d.SnapshotClass, d.SnapshotClassEvent = "", ""
}

var fallbackMessages = map[string]string{
	cdiv1.FallbackNoVolumeSnapshotClass:    cdiv1.FallbackMessageNoVolumeSnapshotClass,
	cdiv1.FallbackIncompatibleProvisioners: cdiv1.FallbackMessageIncompatibleProvisioners,
	cdiv1.FallbackIncompatibleVolumeModes:  cdiv1.FallbackMessageIncompatibleVolumeModes,
	cdiv1.FallbackNoVolumeExpansion:        cdiv1.FallbackMessageNoVolumeExpansion,
	cdiv1.FallbackNoProvisionerMatch:       cdiv1.FallbackMessageNoProvisionerMatch,
}

// The plans, CDI's. A snapshot source copied host-assisted is first restored
// into a temporary claim (SnapshotClone, PrepClaim) for the copy to read.
var (
	phasesFromClaim = map[cdiv1.CDICloneStrategy][]PhaseName{
		cdiv1.CloneStrategyHostAssisted: {PhaseHostClone, PhaseRebind},
		cdiv1.CloneStrategySnapshot:     {PhaseSnapshot, PhaseSnapshotClone, PhasePrepClaim, PhaseRebind},
		cdiv1.CloneStrategyCsiClone:     {PhaseCSIClone, PhasePrepClaim, PhaseRebind},
	}
	phasesFromSnapshot = map[cdiv1.CDICloneStrategy][]PhaseName{
		cdiv1.CloneStrategySnapshot:     {PhaseSnapshotClone, PhasePrepClaim, PhaseRebind},
		cdiv1.CloneStrategyHostAssisted: {PhaseSnapshotClone, PhasePrepClaim, PhaseHostClone, PhaseRebind},
	}
)

// commonDriver is the CSI driver both volumes share: for each, the bound
// PV's driver, else its StorageClass's provisioner (the target is not bound
// yet). It returns "" and a sentence saying why when there is none.
func commonDriver(src *SourceClaim, targetClass *storagev1.StorageClass) (string, string) {
	srcDriver := src.PVDriver
	if srcDriver == "" && src.Class != nil {
		srcDriver = src.Class.Provisioner
	}
	tgtDriver := targetClass.Provisioner
	switch {
	case srcDriver == "":
		return "", "the source's driver is unknown (its PV is not CSI and it has no StorageClass)"
	case tgtDriver == "":
		return "", fmt.Sprintf("StorageClass %s has no provisioner", targetClass.Name)
	case srcDriver != tgtDriver:
		return "", fmt.Sprintf("the source's volume is on driver %q but StorageClass %s provisions with %q", srcDriver, targetClass.Name, tgtDriver)
	}
	return srcDriver, ""
}

func noClassHint(driver, driverNote string) string {
	if driver == "" {
		return driverNote
	}
	return fmt.Sprintf("create a VolumeSnapshotClass for driver %q to clone by snapshot", driver)
}

func profileClass(p *cdiv1.StorageProfileStatus) *string {
	if p == nil {
		return nil
	}
	return p.SnapshotClass
}

func permissive(pvc *corev1.PersistentVolumeClaim) bool {
	_, ok := pvc.Annotations[cdiv1.AnnPermissiveClone]
	return ok
}

func allowsExpansion(sc *storagev1.StorageClass) bool {
	return sc.AllowVolumeExpansion != nil && *sc.AllowVolumeExpansion
}

// volumeMode resolves an unset mode to Filesystem, as Kubernetes does.
func volumeMode(m *corev1.PersistentVolumeMode) corev1.PersistentVolumeMode {
	if m == nil || *m == "" {
		return corev1.PersistentVolumeFilesystem
	}
	return *m
}

func claimRequest(pvc *corev1.PersistentVolumeClaim) resource.Quantity {
	return pvc.Spec.Resources.Requests[corev1.ResourceStorage]
}

func contentType(in Input) cdiv1.DataVolumeContentType {
	if in.ContentType != "" {
		return in.ContentType
	}
	if v := in.Target.Annotations[cdiv1.AnnContentType]; v != "" {
		return cdiv1.DataVolumeContentType(v)
	}
	return cdiv1.DataVolumeKubeVirt
}
