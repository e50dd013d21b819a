package storage

import (
	"fmt"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// Reasons of the StorageProfile Recognized condition.
const (
	ReasonKnownProvisioner        = "KnownProvisioner"
	ReasonUserClaimPropertySets   = "UserClaimPropertySets"
	ReasonUnknownProvisioner      = "UnknownProvisioner"
	ReasonInvalidClaimPropertySet = "InvalidClaimPropertySets"
	ReasonStaticVolumes           = "StaticVolumes"
)

// ProfileDecision is everything the StorageProfile reconciler writes for one
// class, decided without I/O.
type ProfileDecision struct {
	// Status is the desired status, without Conditions.
	Status cdiv1.StorageProfileStatus
	// Recognized is the desired Recognized condition (no transition time).
	Recognized metav1.Condition
	// Notes are problems with the user's input worth an Event and a log line.
	Notes []string
	// CloneStrategyFrom says where the clone strategy came from.
	CloneStrategyFrom string
}

// DecideStorageProfile computes a profile's status from its class, its spec,
// the VolumeSnapshotClasses in the cluster and, for a class without a
// provisioner, the PersistentVolumes (pvs may be nil for other classes).
func DecideStorageProfile(sc *storagev1.StorageClass, spec cdiv1.StorageProfileSpec, snapshotClasses []snapshotv1.VolumeSnapshotClass, pvs []corev1.PersistentVolume) ProfileDecision {
	var d ProfileDecision
	name, provisioner := sc.Name, sc.Provisioner
	d.Status.StorageClass = &name
	d.Status.Provisioner = &provisioner

	snapClass, note := SnapshotClassFor(provisioner, spec.SnapshotClass, snapshotClasses)
	if note != "" {
		d.Notes = append(d.Notes, note)
	}
	if snapClass != "" {
		d.Status.SnapshotClass = &snapClass
	}
	strategy, from := CloneStrategyFor(spec.CloneStrategy, sc.Annotations, provisioner, sc.Parameters, snapClass)
	d.Status.CloneStrategy = &strategy
	d.CloneStrategyFrom = from
	if v, ok := sc.Annotations[cdiv1.AnnCloneStrategy]; ok && spec.CloneStrategy == nil {
		if _, valid := ParseCloneStrategy(v); !valid {
			d.Notes = append(d.Notes, fmt.Sprintf("StorageClass annotation %s=%q is not one of copy, snapshot, csi-clone; ignored", cdiv1.AnnCloneStrategy, v))
		}
	}
	format := DataImportCronSourceFormatFor(spec.DataImportCronSourceFormat, provisioner, sc.Parameters, snapClass)
	d.Status.DataImportCronSourceFormat = &format

	d.Recognized = metav1.Condition{Type: cdiv1.StorageProfileRecognized}
	switch {
	case len(spec.ClaimPropertySets) > 0:
		if err := ValidateClaimPropertySets(spec.ClaimPropertySets); err != nil {
			d.Recognized.Status = metav1.ConditionFalse
			d.Recognized.Reason = ReasonInvalidClaimPropertySet
			d.Recognized.Message = err.Error()
			d.Notes = append(d.Notes, err.Error())
			break
		}
		d.Status.ClaimPropertySets = spec.ClaimPropertySets
		d.Recognized.Status = metav1.ConditionTrue
		d.Recognized.Reason = ReasonUserClaimPropertySets
		d.Recognized.Message = "claim properties come from spec.claimPropertySets"
	case provisioner == NoProvisioner:
		d.Status.ClaimPropertySets = ClaimPropertySetsFromVolumes(name, pvs)
		if len(d.Status.ClaimPropertySets) > 0 {
			d.Recognized.Status = metav1.ConditionTrue
			d.Recognized.Reason = ReasonStaticVolumes
			d.Recognized.Message = "claim properties come from the PersistentVolumes of this class"
		} else {
			d.Recognized.Status = metav1.ConditionFalse
			d.Recognized.Reason = ReasonUnknownProvisioner
			d.Recognized.Message = "the class has no provisioner and no PersistentVolumes yet; create PersistentVolumes for it or set spec.claimPropertySets"
		}
	default:
		d.Status.ClaimPropertySets = ClaimPropertySetsFor(provisioner, sc.Parameters)
		if len(d.Status.ClaimPropertySets) > 0 {
			d.Recognized.Status = metav1.ConditionTrue
			d.Recognized.Reason = ReasonKnownProvisioner
			d.Recognized.Message = fmt.Sprintf("claim properties for provisioner %q come from the known-provisioner table", provisioner)
		} else {
			d.Recognized.Status = metav1.ConditionFalse
			d.Recognized.Reason = ReasonUnknownProvisioner
			d.Recognized.Message = fmt.Sprintf("provisioner %q is not in the known-provisioner table; set spec.claimPropertySets (accessModes and volumeMode) so that DataVolumes using spec.storage can be completed", provisioner)
		}
	}
	return d
}
