package controller

import (
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// The kinds of DataVolume source Kubefill fills, one row each. The
// DataVolume controller reads this table wherever a kind matters (which
// populator source to write, what the claim is annotated with, which phases
// and completion message the DataVolume reports) instead of switching on the
// source, so a new kind is one more row.

// sourceKind is one kind of DataVolume source and the populator that fills it.
type sourceKind struct {
	// name is the kind in messages.
	name string
	// matches reports whether a DataVolume's source is of this kind. At
	// most one row matches: the API admits exactly one source.
	matches func(*cdiv1.DataVolume) bool
	// ref is the Kind of the populator source the claim's dataSourceRef names.
	ref string
	// sourceName is the name of that source, in the DataVolume's namespace
	// and owned by it.
	sourceName func(*cdiv1.DataVolume) string
	// newSource returns an empty source object of this kind, to watch and
	// to write.
	newSource func() client.Object
	// setSpec renders the source's spec from the DataVolume into src, an
	// object newSource made.
	setSpec func(src client.Object, dv *cdiv1.DataVolume)
	// immediateBinding: the claim must not wait for another consumer, the
	// kind's own worker pod being its first.
	immediateBinding bool
	// clone: the source may live in another namespace and be reached through
	// a DataSource, the claim takes its size from it, and the claim is made
	// by reconcileCloneClaim; the DataVolume never fails on a worker pod (a
	// clone error shows in the Running condition, as in CDI).
	clone bool
	// doneMessage is the Running condition's message once the data is in.
	doneMessage string
	// phase is the DataVolume's phase while the population runs: the claim
	// exists and is neither populated, lost nor failed.
	phase func(workerView) cdiv1.DataVolumePhase
}

// sourceKinds are the kinds the DataVolume controller fills.
var sourceKinds = []sourceKind{
	{
		name:       "import",
		matches:    IsImport,
		ref:        cdiv1.VolumeImportSourceRef,
		sourceName: ImportSourceName,
		newSource:  func() client.Object { return &cdiv1.VolumeImportSource{} },
		setSpec: func(src client.Object, dv *cdiv1.DataVolume) {
			src.(*cdiv1.VolumeImportSource).Spec = ImportSourceFor(dv)
		},
		doneMessage: "Import Complete",
		phase:       importPhase,
	},
	{
		name:       "upload",
		matches:    IsUpload,
		ref:        cdiv1.VolumeUploadSourceRef,
		sourceName: UploadSourceName,
		newSource:  func() client.Object { return &cdiv1.VolumeUploadSource{} },
		setSpec: func(src client.Object, dv *cdiv1.DataVolume) {
			src.(*cdiv1.VolumeUploadSource).Spec = UploadSourceFor(dv)
		},
		// Nothing consumes an upload target before the upload: its upload
		// pod is the first consumer.
		immediateBinding: true,
		doneMessage:      "Upload Complete",
		phase:            uploadPhase,
	},
	{
		// source.pvc, source.snapshot or a sourceRef to a DataSource. The
		// VolumeCloneSource lives in the source's namespace and the claim
		// needs the source's size: reconcileCloneClaim renders both.
		name:       "clone",
		matches:    IsClone,
		ref:        cdiv1.VolumeCloneSourceRef,
		sourceName: CloneSourceName,
		newSource:  func() client.Object { return &cdiv1.VolumeCloneSource{} },
		setSpec: func(src client.Object, dv *cdiv1.DataVolume) {
			if s := DirectCloneSource(dv); s != nil {
				src.(*cdiv1.VolumeCloneSource).Spec = CloneSourceSpecFor(dv, *s)
			}
		},
		clone:       true,
		doneMessage: "Clone Complete",
		phase:       clonePhase,
	},
}

// kindOf returns the row of a DataVolume's source, nil for a source
// Kubefill does not fill.
func kindOf(dv *cdiv1.DataVolume) *sourceKind {
	for i := range sourceKinds {
		if sourceKinds[i].matches(dv) {
			return &sourceKinds[i]
		}
	}
	return nil
}

// reportingKindOf is the row whose phases and messages a DataVolume's
// status uses: its own, or the import's for a source of no kind (whose
// claim can only have been adopted).
func reportingKindOf(dv *cdiv1.DataVolume) *sourceKind {
	if k := kindOf(dv); k != nil {
		return k
	}
	return &sourceKinds[0]
}

// workerView is what the populator reports on the claim about its worker,
// as the phases read it.
type workerView struct {
	// PodPhase is the worker pod's phase; "" before there is a pod.
	PodPhase corev1.PodPhase
	// PodReady: the worker pod is ready (an upload server accepts data).
	PodReady bool
	// PrimeExists: the populator has made the PVC-prime.
	PrimeExists bool
	// WaitsForConsumer: the claim's class binds on first consumer and no node is chosen yet.
	WaitsForConsumer bool
	// ClonePhase is the claim's cdi.kubevirt.io/clonePhase.
	ClonePhase string
	// Current is the DataVolume's phase now.
	Current cdiv1.DataVolumePhase
}

// importPhase is an import DataVolume's phase before it succeeds or fails:
// ImportInProgress while the importer runs (and once it is done, until the
// volume moves to the claim), ImportScheduled while its prime or pod is made.
func importPhase(w workerView) cdiv1.DataVolumePhase {
	switch {
	case w.PodPhase == corev1.PodRunning, w.PodPhase == corev1.PodSucceeded:
		return cdiv1.ImportInProgress
	case w.PodPhase == corev1.PodPending || w.PrimeExists:
		return cdiv1.ImportScheduled
	case w.WaitsForConsumer:
		return cdiv1.PendingPopulation
	}
	return cdiv1.Pending
}

// uploadPhase is an upload DataVolume's phase before it succeeds or fails:
// UploadReady while the upload server accepts data (and once it has it, until
// the volume moves to the claim), UploadScheduled while its pod starts.
// virtctl waits for UploadReady.
func uploadPhase(w workerView) cdiv1.DataVolumePhase {
	switch {
	case w.PodReady || w.PodPhase == corev1.PodSucceeded:
		return cdiv1.UploadReady
	case w.PodPhase != "" || w.PrimeExists:
		return cdiv1.UploadScheduled
	case w.WaitsForConsumer:
		return cdiv1.PendingPopulation
	}
	return cdiv1.Pending
}

// IsImport reports whether a DataVolume's source is one the import
// populator fills.
func IsImport(dv *cdiv1.DataVolume) bool {
	s := dv.Spec.Source
	return dv.Spec.SourceRef == nil && s != nil &&
		(s.HTTP != nil || s.S3 != nil || s.GCS != nil || s.Registry != nil || s.Blank != nil || s.Imageio != nil || s.VDDK != nil)
}

// IsUpload reports whether a DataVolume waits for an upload.
func IsUpload(dv *cdiv1.DataVolume) bool {
	return dv.Spec.SourceRef == nil && dv.Spec.Source != nil && dv.Spec.Source.Upload != nil
}

// ImportSourceName is the name of the VolumeImportSource a DataVolume owns.
func ImportSourceName(dv *cdiv1.DataVolume) string {
	return "volume-import-source-" + string(dv.UID)
}

// UploadSourceName is the name of the VolumeUploadSource a DataVolume owns.
func UploadSourceName(dv *cdiv1.DataVolume) string {
	return "volume-upload-source-" + string(dv.UID)
}
