package storage

import (
	"fmt"
	"sort"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// How clones and DataImportCron images are kept on a class. CloneStrategyFor
// and SnapshotClassFor are the entry points of the clone planner (pkg/clone)
// as much as of the StorageProfile reconciler: both read them the same way.

// AnnDefaultSnapshotClass marks the default VolumeSnapshotClass of a driver,
// spelt as the snapshot-controller and CDI read it.
const AnnDefaultSnapshotClass = cdiv1.AnnDefaultSnapshotClass

// ParseCloneStrategy reads a clone strategy as the StorageClass annotation
// and the API spell it; ok is false for anything else.
func ParseCloneStrategy(v string) (cdiv1.CDICloneStrategy, bool) {
	switch s := cdiv1.CDICloneStrategy(v); s {
	case cdiv1.CloneStrategyHostAssisted, cdiv1.CloneStrategySnapshot, cdiv1.CloneStrategyCsiClone:
		return s, true
	}
	return "", false
}

// CloneStrategyFor decides the clone strategy of a class, as a
// StorageProfile's status.cloneStrategy reports it. In order: the profile's
// spec; the class annotation cdi.kubevirt.io/clone-strategy (an unknown value
// is ignored); the advice of the known-provisioner table for the driver and
// its class parameters; snapshot where snapClass (the VolumeSnapshotClass
// SnapshotClassFor chose, "" for none) exists; else copy. A snapshot
// strategy without a snapshot class falls back to copy, unless the user
// asked for it in the spec or the annotation. It also returns where the
// choice came from, for logs and fallback reasons.
func CloneStrategyFor(spec *cdiv1.CDICloneStrategy, classAnnotations map[string]string, provisioner string, params map[string]string, snapClass string) (cdiv1.CDICloneStrategy, string) {
	if spec != nil {
		return *spec, "spec"
	}
	if v, ok := classAnnotations[cdiv1.AnnCloneStrategy]; ok {
		if s, ok := ParseCloneStrategy(v); ok {
			return s, "storage class annotation"
		}
	}
	strategy, from := cdiv1.CloneStrategyHostAssisted, "no VolumeSnapshotClass for the driver"
	if snapClass != "" {
		strategy, from = cdiv1.CloneStrategySnapshot, "VolumeSnapshotClass "+snapClass
	}
	if advised, ok := advisedCloneStrategyByKey[provisionerKey(provisioner, params)]; ok {
		strategy, from = advised, "known driver"
	}
	if strategy == cdiv1.CloneStrategySnapshot && snapClass == "" {
		return cdiv1.CloneStrategyHostAssisted, "known driver, but no VolumeSnapshotClass"
	}
	return strategy, from
}

// SnapshotClassFor picks the VolumeSnapshotClass for a CSI driver among
// classes (all of the cluster's). A class named in specName (a
// StorageProfile's spec.snapshotClass) is used when it exists and serves the
// driver; otherwise the result is "" and note says why. Without a spec name,
// a matching class annotated AnnDefaultSnapshotClass wins, then the first
// matching one by name; "" with no note when the driver has none.
func SnapshotClassFor(driver string, specName *string, classes []snapshotv1.VolumeSnapshotClass) (name, note string) {
	if specName != nil {
		for i := range classes {
			if classes[i].Name != *specName {
				continue
			}
			if classes[i].Driver != driver {
				return "", fmt.Sprintf("spec.snapshotClass %q serves driver %q, not %q", *specName, classes[i].Driver, driver)
			}
			return *specName, ""
		}
		return "", fmt.Sprintf("spec.snapshotClass %q does not exist", *specName)
	}
	var matching, defaults []string
	for i := range classes {
		if classes[i].Driver != driver {
			continue
		}
		matching = append(matching, classes[i].Name)
		if classes[i].Annotations[AnnDefaultSnapshotClass] == "true" {
			defaults = append(defaults, classes[i].Name)
		}
	}
	sort.Strings(matching)
	sort.Strings(defaults)
	switch {
	case len(defaults) > 0:
		return defaults[0], ""
	case len(matching) > 0:
		return matching[0], ""
	}
	return "", ""
}

// SmartCloneFor says whether clones on a profile avoid the host-assisted
// copy: snapshot needs a VolumeSnapshotClass, csi-clone a registered CSIDriver.
func SmartCloneFor(status cdiv1.StorageProfileStatus, csiDriverExists bool) bool {
	if status.CloneStrategy == nil {
		return false
	}
	switch *status.CloneStrategy {
	case cdiv1.CloneStrategySnapshot:
		return status.SnapshotClass != nil && *status.SnapshotClass != ""
	case cdiv1.CloneStrategyCsiClone:
		return csiDriverExists
	}
	return false
}

// DataImportCronSourceFormatFor decides how DataImportCrons keep images on a
// class: the spec's choice, else snapshot for drivers known to scale better
// with it (when a snapshot class exists), else pvc.
func DataImportCronSourceFormatFor(spec *cdiv1.DataImportCronSourceFormat, provisioner string, params map[string]string, snapClass string) cdiv1.DataImportCronSourceFormat {
	if spec != nil {
		return *spec
	}
	if snapshotSourceFormatKeys[provisionerKey(provisioner, params)] && snapClass != "" {
		return cdiv1.DataImportCronSourceFormatSnapshot
	}
	return cdiv1.DataImportCronSourceFormatPvc
}
