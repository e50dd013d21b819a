package storage

import (
	storagev1 "k8s.io/api/storage/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// The default StorageClass. Kubernetes lets several classes carry the
// default annotation and picks among them the way its DefaultStorageClass
// admission plugin does: the newest creationTimestamp wins, ties go to the
// name first in order. CDI picks its virtualization default class among
// several the same way. Every caller in Kubefill uses these functions, so a
// claim's class, the scratch-space class and the DataVolume's class agree.

// IsDefaultClass reports whether a class is annotated as the cluster default.
func IsDefaultClass(sc *storagev1.StorageClass) bool {
	return sc.Annotations[cdiv1.AnnDefaultStorageClass] == "true"
}

// IsVirtDefaultClass reports whether a class is annotated as the default
// class for virtualization workloads.
func IsVirtDefaultClass(sc *storagev1.StorageClass) bool {
	return sc.Annotations[cdiv1.AnnDefaultVirtStorageClass] == "true"
}

// DefaultClassName is the cluster's default class: among the classes
// annotated as the default, the newest, ties broken by name; "" when none is.
func DefaultClassName(classes []storagev1.StorageClass) string {
	return newest(classes, IsDefaultClass)
}

// VirtDefaultClassName is the virtualization default class, chosen among
// the classes annotated as such by the same rule; "" when none is.
func VirtDefaultClassName(classes []storagev1.StorageClass) string {
	return newest(classes, IsVirtDefaultClass)
}

// DataVolumeClassName is the class of a DataVolume that names none, as CDI
// chooses it: the virtualization default class, else the cluster default,
// else "" (the claim then gets whatever the API server's admission gives).
func DataVolumeClassName(classes []storagev1.StorageClass) string {
	if name := VirtDefaultClassName(classes); name != "" {
		return name
	}
	return DefaultClassName(classes)
}

// newest returns the newest of the classes marked, ties broken by name.
func newest(classes []storagev1.StorageClass, marked func(*storagev1.StorageClass) bool) string {
	var best *storagev1.StorageClass
	for i := range classes {
		c := &classes[i]
		if !marked(c) {
			continue
		}
		if best == nil || c.CreationTimestamp.After(best.CreationTimestamp.Time) ||
			(c.CreationTimestamp.Equal(&best.CreationTimestamp) && c.Name < best.Name) {
			best = c
		}
	}
	if best == nil {
		return ""
	}
	return best.Name
}
