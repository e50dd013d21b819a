package clone

import (
	"fmt"
	"math"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

const mib = 1 << 20

// SizeWithOverhead is the Filesystem request that holds size bytes of disk
// image once the filesystem has taken its share: size rounded up to a whole
// MiB, then divided by (1 - overhead), as CDI computes it.
func SizeWithOverhead(size int64, overhead float64) (int64, error) {
	if err := checkOverhead(overhead); err != nil {
		return 0, err
	}
	aligned := roundUp(size, mib)
	return int64(math.Ceil(float64(aligned) / (1 - overhead))), nil
}

// usableSpace is what a claim of size bytes holds of disk image: all of a
// Block device, or what the filesystem leaves, rounded down to a MiB
// (qemu-img rounds up, so a partial MiB cannot be used).
func usableSpace(size int64, mode corev1.PersistentVolumeMode, overhead float64) int64 {
	if mode == corev1.PersistentVolumeBlock {
		return size
	}
	return roundDown(int64(math.Ceil((1-overhead)*float64(size))), mib)
}

func checkOverhead(overhead float64) error {
	if overhead < 0 || overhead >= 1 || math.IsNaN(overhead) {
		return fmt.Errorf("filesystem overhead %v is not a share from 0 to below 1", overhead)
	}
	return nil
}

func roundUp(n, unit int64) int64 { return (n + unit - 1) / unit * unit }

func roundDown(n, unit int64) int64 { return n / unit * unit }

// sizeTarget starts a Decision with the target's size: its request, or the
// sizeless rule's when it gives none.
func sizeTarget(in Input, sizeless func() (resource.Quantity, error)) (Decision, error) {
	var d Decision
	if req, ok := in.Target.Spec.Resources.Requests[corev1.ResourceStorage]; ok && !req.IsZero() {
		d.TargetSize = req
		return d, nil
	}
	size, err := sizeless()
	if err != nil {
		return d, err
	}
	d.TargetSize, d.Sizeless = size, true
	return d, nil
}

// sizelessFromClaim is the size of a sizeless clone of a claim: the
// source's capacity, inflated when a Block source fills a Filesystem target
// so that the whole device fits in disk.img.
func sizelessFromClaim(in Input) (resource.Quantity, error) {
	src := in.SourceClaim.Claim
	capacity, ok := src.Status.Capacity[corev1.ResourceStorage]
	if !ok {
		return resource.Quantity{}, fmt.Errorf("%w: source claim %s has no status.capacity to size the target from (is it Bound?)", ErrSourceNotReady, src.Name)
	}
	return inflateAcrossModes(capacity, volumeMode(src.Spec.VolumeMode), in)
}

// sizelessFromSnapshot is the size of a sizeless clone of a snapshot: its
// restoreSize, inflated when the snapshot is of a Block volume and the
// target is Filesystem (CDI issue #3900). A snapshot of unknown mode is
// taken as the target's.
func sizelessFromSnapshot(in Input) (resource.Quantity, error) {
	snap := in.SourceSnapshot
	if snap.RestoreSize.IsZero() {
		return resource.Quantity{}, &Refusal{Event: EventCloneValidationFailed,
			Message: "size not specified by user/provisioner, can't tell how much needed for restore"}
	}
	mode := volumeMode(in.Target.Spec.VolumeMode)
	if snap.SourceVolumeMode != nil {
		mode = volumeMode(snap.SourceVolumeMode)
	}
	return inflateAcrossModes(*snap.RestoreSize, mode, in)
}

func inflateAcrossModes(size resource.Quantity, srcMode corev1.PersistentVolumeMode, in Input) (resource.Quantity, error) {
	if srcMode != corev1.PersistentVolumeBlock || volumeMode(in.Target.Spec.VolumeMode) != corev1.PersistentVolumeFilesystem {
		return size, nil
	}
	grown, err := SizeWithOverhead(size.Value(), in.FilesystemOverhead)
	if err != nil {
		return resource.Quantity{}, err
	}
	return *resource.NewQuantity(grown, resource.BinarySI), nil
}

// checkNotSmaller refuses a target smaller than its source, in CDI's words.
func checkNotSmaller(target, source resource.Quantity) error {
	if target.Cmp(source) < 0 {
		return &Refusal{Event: EventIncompatiblePVC,
			Message: fmt.Sprintf("target resources requests storage size is smaller than the source %d < %d", target.Value(), source.Value())}
	}
	return nil
}

// checkCopy refuses a host-assisted copy that cannot work: across volume
// modes only a disk image can travel (disk.img ⇄ raw device), and a Block
// source must fit in the disk.img a Filesystem target leaves room for.
// Without the second check the copy fails near its end (CDI #3900).
func checkCopy(in Input, srcMode corev1.PersistentVolumeMode, srcBytes, targetSize resource.Quantity) error {
	tgtMode := volumeMode(in.Target.Spec.VolumeMode)
	if srcMode == tgtMode {
		return nil
	}
	if ct := contentType(in); ct != cdiv1.DataVolumeKubeVirt {
		return &Refusal{Event: EventIncompatiblePVC,
			Message: fmt.Sprintf("source volumeMode (%s) and target volumeMode (%s) do not match, contentType (%s)", srcMode, tgtMode, ct)}
	}
	if srcMode != corev1.PersistentVolumeBlock || permissive(in.Target) {
		return nil
	}
	if err := checkOverhead(in.FilesystemOverhead); err != nil {
		return err
	}
	usable := usableSpace(targetSize.Value(), tgtMode, in.FilesystemOverhead)
	if usable >= srcBytes.Value() {
		return nil
	}
	need, _ := SizeWithOverhead(srcBytes.Value(), in.FilesystemOverhead)
	return &Refusal{Event: EventIncompatiblePVC, Message: fmt.Sprintf(
		"target resources requests storage size is smaller than the source: a Filesystem target of %d bytes holds a %d-byte disk.img after %.4g%% filesystem overhead, "+
			"less than the Block source's %d bytes; ask for at least %s",
		targetSize.Value(), usable, in.FilesystemOverhead*100, srcBytes.Value(), resource.NewQuantity(need, resource.BinarySI).String())}
}

// sourceBytes is how much a source claim's volume holds: its capacity, or
// its request before it is bound.
func sourceBytes(pvc *corev1.PersistentVolumeClaim) resource.Quantity {
	if c, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
		return c
	}
	return claimRequest(pvc)
}
