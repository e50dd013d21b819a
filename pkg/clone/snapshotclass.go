package clone

import (
	"fmt"
	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"sort"
)

// SnapshotClass is what the planner needs of a VolumeSnapshotClass, so that
// it depends on no snapshot client version.
type SnapshotClass struct {
	Name   string
	Driver string
	// Default is set when the class is annotated
	// snapshot.storage.kubernetes.io/is-default-class: "true".
	Default bool
}

// SnapshotClassOf builds a SnapshotClass from a VolumeSnapshotClass's name,
// driver and annotations.
func SnapshotClassOf(name, driver string, annotations map[string]string) SnapshotClass {
	return SnapshotClass{Name: name, Driver: driver, Default: annotations[cdiv1.AnnDefaultSnapshotClass] == "true"}
}

// ChooseSnapshotClass picks the VolumeSnapshotClass for a snapshot clone on
// driver, by CDI's rule: the class both StorageProfiles name in
// status.snapshotClass, if they agree; else the driver's class annotated as
// default; else the driver's first by name. It returns the class and the
// message of the Normal event EventVolumeSnapshotClassSelected, or, when
// there is none, "" and a note saying why when the profiles' class is the
// cause (else note is "" too).
func ChooseSnapshotClass(driver string, sourceProfileClass, targetProfileClass *string, classes []SnapshotClass) (name, event, note string) {
	if sourceProfileClass != nil && targetProfileClass != nil && *sourceProfileClass != "" && *sourceProfileClass == *targetProfileClass {
		want := *sourceProfileClass
		for _, c := range classes {
			if c.Name != want {
				continue
			}
			if c.Driver != driver {
				return "", "", fmt.Sprintf("the StorageProfiles name VolumeSnapshotClass %s, which serves driver %q, not %q; set their spec.snapshotClass to a class of driver %q", want, c.Driver, driver, driver)
			}
			return want, "VolumeSnapshotClass selected according to StorageProfile " + want, ""
		}
		return "", "", fmt.Sprintf("the StorageProfiles name VolumeSnapshotClass %s, which does not exist; create it for driver %q or change their spec.snapshotClass", want, driver)
	}
	var matching, defaults []string
	for _, c := range classes {
		if c.Driver != driver {
			continue
		}
		matching = append(matching, c.Name)
		if c.Default {
			defaults = append(defaults, c.Name)
		}
	}
	sort.Strings(matching)
	sort.Strings(defaults)
	switch {
	case len(defaults) > 0:
		return defaults[0], "Default VolumeSnapshotClass selected " + defaults[0], ""
	case len(matching) > 0:
		return matching[0], "First VolumeSnapshotClass selected " + matching[0], ""
	}
	return "", "", ""
}
