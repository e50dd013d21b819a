// Package populators holds the volume populators for VolumeImportSource and
// VolumeUploadSource, and the base a clone populator will stand on.
//
// One Reconciler runs every kind: it checks the claim can be filled (a CSI
// StorageClass, a chosen node, an authorised source), reads the source, then
// runs the kind's plan, an ordered list of phases that each read, decide and
// act idempotently, stopping at the first that is not done. The shared
// phases are PrimePhase (the PVC-prime), WorkerPhase (one worker pod, from
// a kind's container: rendering, retries with backoff, cleanup) and
// RebindPhase (the filled volume handed to the claim). Import is prime →
// worker → rebind; upload is prime → serving → worker → rebind. What a kind
// needs beyond that (authorising its source, extra watches, a finalizer for
// objects in another namespace) are optional interfaces. See
// docs/architecture.md.
package populators
