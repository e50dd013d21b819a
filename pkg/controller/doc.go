// Package controller holds Kubefill's controllers for the CDI API: the
// DataVolume, StorageProfile and CDIConfig reconcilers, and the manager that
// runs them.
package controller
