// Package populators holds the volume populators for VolumeImportSource,
// VolumeUploadSource and VolumeCloneSource: a shared reconciler that creates
// a PVC-prime, fills it through a worker pod and rebinds its PV to the
// user's claim, plus one small type per source kind. (Lands with issue 6.)
package populators
