// Package storage holds Kubefill's storage rules, pure functions without
// I/O: the known-provisioner table (the claim properties, clone strategy and
// DataImportCron format that work with each driver), the decisions a
// StorageProfile's status is made of, the VolumeSnapshotClass and clone
// strategy lookups the clone planner shares, and the one rule for the
// default StorageClass.
//
// It is a leaf: it imports the API and Kubernetes types only, never the
// controllers, the populators or the worker packages.
package storage
