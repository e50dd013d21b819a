// Package clone plans and runs clones: a pure planner picks the snapshot,
// CSI-clone or host-assisted strategy from StorageProfiles and records why it
// falls back, and each phase is a small type with a Reconcile. (Lands with
// the clone issue.)
package clone
