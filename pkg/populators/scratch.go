package populators

import (
	"fmt"
	"math"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

// Scratch space is a claim, as CDI's is: a worker that spools an image
// before converting it (vmdk, vdi, vhd(x), registry layers, uploads) gets
// <prime>-scratch in the prime's namespace, so that a large image fills a
// volume of the cluster's storage and counts against the namespace's
// storage quota, never the node's ephemeral storage.

// ScratchWorker is the worker whose scratch space is decided.
type ScratchWorker int

const (
	// ScratchImporter is the importer pod.
	ScratchImporter ScratchWorker = iota
	// ScratchUploadServer is the upload server of an upload (not of a
	// host-assisted clone, whose stream is written as it comes).
	ScratchUploadServer
)

// ScratchInput is what decides a worker's scratch space.
type ScratchInput struct {
	Worker ScratchWorker
	// Source is the importer's source (contract.Source*).
	Source string
	// ContentType is the claim's (kubevirt or archive).
	ContentType string
	// Annotations are the target's and the prime's: either one's
	// cdi.kubevirt.io/storage.import.requiresScratch "true" forces scratch
	// space. The controller writes it on the prime when an importer
	// reported that its image needs scratch space.
	Annotations []map[string]string
}

// ScratchDecision is a worker's scratch space: none, or a claim of
// StorageClass ("" leaves the class to the cluster's default) and Size.
type ScratchDecision struct {
	Needed       bool
	StorageClass string
	Size         resource.Quantity
}

// RequiresScratch is CDI's requiresScratchSpace and the upload
// controller's rule: every upload (its format is known only once its bytes
// arrive, and the user's stream cannot be read twice), every archive, and
// registry imports (pulled by the pod, the only way Kubefill pulls) need
// scratch space; an http or s3 import needs it once its importer said so.
// A parseable "true" in requiresScratch forces it. Pure.
func RequiresScratch(in ScratchInput) bool {
	needed := false
	switch {
	case in.Worker == ScratchUploadServer:
		needed = true
	case in.ContentType == string(cdiv1.DataVolumeArchive):
		needed = true
	case in.Source == contract.SourceRegistry:
		needed = true
	}
	for _, ann := range in.Annotations {
		if forced, err := strconv.ParseBool(ann[cdiv1.AnnRequiresScratch]); err == nil && forced {
			needed = true
		}
	}
	return needed
}

// DecideScratch is the scratch space of prime's worker: whether it needs
// any, in which class, and how large. The class is CDIConfig's
// status.scratchSpaceStorageClass (the spec's class when it exists, else
// the cluster's default class), else the prime's. The size is CDI's: the
// prime's usable space (its request less its filesystem overhead; a Block
// prime has none) plus the scratch class's filesystem overhead, rounded up
// to whole MiB. Pure.
func DecideScratch(in ScratchInput, prime *corev1.PersistentVolumeClaim, config *cdiv1.CDIConfig) (ScratchDecision, error) {
	if !RequiresScratch(in) {
		return ScratchDecision{}, nil
	}
	class := config.Status.ScratchSpaceStorageClass
	if class == "" {
		class = ptr.Deref(prime.Spec.StorageClassName, "")
	}
	primeOverhead := 0.0
	if ptr.Deref(prime.Spec.VolumeMode, corev1.PersistentVolumeFilesystem) == corev1.PersistentVolumeFilesystem {
		v, err := parseOverhead(FilesystemOverhead(config, ptr.Deref(prime.Spec.StorageClassName, "")))
		if err != nil {
			return ScratchDecision{}, err
		}
		primeOverhead = v
	}
	scratchOverhead, err := parseOverhead(FilesystemOverhead(config, class))
	if err != nil {
		return ScratchDecision{}, err
	}
	request := prime.Spec.Resources.Requests[corev1.ResourceStorage]
	usable := usableSpace(primeOverhead, request.Value())
	size := roundUp(requiredSpace(scratchOverhead, usable), alignBlockSize)
	return ScratchDecision{Needed: true, StorageClass: class, Size: *resource.NewQuantity(size, resource.BinarySI)}, nil
}

// alignBlockSize is CDI's DefaultAlignBlockSize: images are sized in whole MiB.
const alignBlockSize = 1 << 20

func parseOverhead(s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || v >= 1 {
		return 0, fmt.Errorf("filesystem overhead %q in CDIConfig is not a fraction from 0 to 1", s)
	}
	return v, nil
}

// usableSpace is CDI's GetUsableSpace: what a volume of size bytes holds
// after the filesystem's overhead, rounded down to whole MiB.
func usableSpace(overhead float64, size int64) int64 {
	without := int64(math.Ceil(float64(size) / (1 + overhead)))
	return without / alignBlockSize * alignBlockSize
}

// requiredSpace is CDI's GetRequiredSpace: the volume size that holds
// size bytes (rounded up to whole MiB) and the filesystem's overhead.
func requiredSpace(overhead float64, size int64) int64 {
	return int64(math.Ceil(float64(roundUp(size, alignBlockSize)) * (1 + overhead)))
}

func roundUp(n, multiple int64) int64 {
	return int64(math.Ceil(float64(n)/float64(multiple))) * multiple
}

// annScratchAttempt on a scratch claim is the worker attempt it was made
// for: each attempt gets a fresh claim, never one an earlier attempt may
// have left half full.
const annScratchAttempt = "kubefill.io/scratch-for-attempt"

// NewScratchClaim renders the scratch claim of prime's worker for attempt:
// CDI's name, ReadWriteOnce, Filesystem, d's class and size, owned by the
// target as the worker pod is (deleting the DataVolume takes it), labelled
// as Kubefill's temporary objects are and kept out of Velero backups. A
// prime waiting for its first consumer passes on the node the scheduler
// chose, so that both volumes are made where the worker runs. Pure.
func NewScratchClaim(target, prime *corev1.PersistentVolumeClaim, component string, d ScratchDecision, attempt int) *corev1.PersistentVolumeClaim {
	labels := workerLabels(target, component)
	labels[cdiv1.LabelExcludeFromVeleroBackup] = "true"
	ann := map[string]string{
		annTargetName:     targetRef(target.Namespace, target.Name, prime.Namespace),
		annScratchAttempt: strconv.Itoa(attempt),
	}
	if node := prime.Annotations[cdiv1.AnnSelectedNode]; node != "" {
		ann[cdiv1.AnnSelectedNode] = node
	}
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: cdiv1.ScratchClaimName(prime.Name), Namespace: prime.Namespace,
			Labels: labels, Annotations: ann, OwnerReferences: ownedBy(target, prime.Namespace),
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:  ptr.To(corev1.PersistentVolumeFilesystem),
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: d.Size}},
		},
	}
	if d.StorageClass != "" {
		claim.Spec.StorageClassName = ptr.To(d.StorageClass)
	}
	return claim
}

// scratchAttempt is the attempt a scratch claim was made for; 0 when it
// does not say.
func scratchAttempt(claim *corev1.PersistentVolumeClaim) int {
	n, _ := strconv.Atoi(claim.Annotations[annScratchAttempt])
	return n
}

// ReasonCreatingScratch is the running condition's reason while a
// worker waits for its scratch claim (CDI's creatingScratch).
const ReasonCreatingScratch = "CreatingScratchSpace"

// ReasonScratchRequired is the reason of an importer started again with
// scratch space after it reported that its image needs some.
const ReasonScratchRequired = "ScratchSpaceRequired"

// scratchPendingMessage says what a worker waits for while its scratch
// claim is not bound. Pure.
func scratchPendingMessage(noun string, claim *corev1.PersistentVolumeClaim) string {
	class := ptr.Deref(claim.Spec.StorageClassName, "")
	if class == "" {
		class = "the cluster's default"
	}
	size := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	phase := claim.Status.Phase
	if phase == "" {
		phase = corev1.ClaimPending
	}
	return fmt.Sprintf("the %s waits for its scratch claim %s/%s (%s, StorageClass %s) to be bound; it is %s",
		noun, claim.Namespace, claim.Name, size.String(), class, phase)
}
