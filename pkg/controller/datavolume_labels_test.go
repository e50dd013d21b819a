package controller

import (
	"reflect"
	"testing"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestInheritedInstancetypeLabels(t *testing.T) {
	source := map[string]string{
		cdiv1.LabelDefaultInstancetype: "u1.small", cdiv1.LabelDefaultPreference: "fedora",
		cdiv1.LabelDefaultPreferenceKind: "VirtualMachineClusterPreference", "app": "not-copied",
	}
	cases := []struct {
		name     string
		dv, want map[string]string
	}{
		{"the source's defaults, nothing else", map[string]string{"team": "a"}, map[string]string{
			cdiv1.LabelDefaultInstancetype: "u1.small", cdiv1.LabelDefaultPreference: "fedora", cdiv1.LabelDefaultPreferenceKind: "VirtualMachineClusterPreference"}},
		{"the DataVolume chose one: none copied", map[string]string{cdiv1.LabelDefaultPreference: "rhel"}, nil},
		{"an empty choice is a choice", map[string]string{cdiv1.LabelDefaultInstancetypeKind: ""}, nil},
		{"no labels on the DataVolume", nil, map[string]string{
			cdiv1.LabelDefaultInstancetype: "u1.small", cdiv1.LabelDefaultPreference: "fedora", cdiv1.LabelDefaultPreferenceKind: "VirtualMachineClusterPreference"}},
	}
	for _, c := range cases {
		if got := InheritedInstancetypeLabels(c.dv, source); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if got := InheritedInstancetypeLabels(nil, map[string]string{"app": "x"}); len(got) != 0 {
		t.Errorf("a source without defaults gave %v", got)
	}
}
