package clone

import (
	"strings"
	"testing"

	"k8s.io/utils/ptr"
)

func TestChooseSnapshotClass(t *testing.T) {
	classes := []SnapshotClass{
		{Name: "b", Driver: driverA}, {Name: "a", Driver: driverA}, {Name: "other", Driver: driverB, Default: true},
		{Name: "z-default", Driver: driverA, Default: true}, {Name: "y-default", Driver: driverA, Default: true},
	}
	cases := []struct {
		name               string
		driver             string
		source, target     *string
		classes            []SnapshotClass
		want, event, noted string
	}{
		{"default, first by name among defaults", driverA, nil, nil, classes, "y-default", "Default VolumeSnapshotClass selected y-default", ""},
		{"first by name", driverA, nil, nil, classes[:3], "a", "First VolumeSnapshotClass selected a", ""},
		{"the profiles agree", driverA, ptr.To("b"), ptr.To("b"), classes, "b", "VolumeSnapshotClass selected according to StorageProfile b", ""},
		{"the profiles disagree: the default rule", driverA, ptr.To("b"), ptr.To("a"), classes, "y-default", "Default VolumeSnapshotClass selected y-default", ""},
		{"one profile names a class: the default rule", driverA, nil, ptr.To("b"), classes, "y-default", "Default VolumeSnapshotClass selected y-default", ""},
		{"the profiles' class serves another driver", driverA, ptr.To("other"), ptr.To("other"), classes, "", "", "serves driver"},
		{"the profiles' class does not exist", driverA, ptr.To("gone"), ptr.To("gone"), classes, "", "", "does not exist"},
		{"no class for the driver", "c.csi.example", nil, nil, classes, "", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name, event, note := ChooseSnapshotClass(c.driver, c.source, c.target, c.classes)
			if name != c.want || event != c.event {
				t.Errorf("got %q %q, want %q %q", name, event, c.want, c.event)
			}
			if (c.noted == "") != (note == "") || !strings.Contains(note, c.noted) {
				t.Errorf("note %q, want one containing %q", note, c.noted)
			}
		})
	}
}

func TestSnapshotClassOf(t *testing.T) {
	if c := SnapshotClassOf("x", driverA, map[string]string{"snapshot.storage.kubernetes.io/is-default-class": "true"}); !c.Default || c.Name != "x" || c.Driver != driverA {
		t.Errorf("annotated class: %+v", c)
	}
	if c := SnapshotClassOf("x", driverA, map[string]string{"snapshot.storage.kubernetes.io/is-default-class": "false"}); c.Default {
		t.Errorf("class annotated false is a default: %+v", c)
	}
}
