package source

import (
	"reflect"
	"testing"
)

func TestImageEnvLabels(t *testing.T) {
	got := ImageEnvLabels([]string{
		"INSTANCETYPE_KUBEVIRT_IO_DEFAULT_INSTANCETYPE=u1.small",
		"INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=fedora",
		"INSTANCETYPE_KUBEVIRT_IO_DISPLAY_NEEDED=true",
		"KUBEVIRT_IO_TEST=x",
		"PATH=/usr/bin",
		"NOTAVAR",
		"SOMETHING_ELSE_IO=y",
	})
	want := map[string]string{
		"instancetype.kubevirt.io/default-instancetype": "u1.small",
		"instancetype.kubevirt.io/default-preference":   "fedora",
		"instancetype.kubevirt.io/display-needed":       "true",
		"kubevirt.io/test":                              "x",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ImageEnvLabels = %v, want %v", got, want)
	}
	for env, key := range map[string]string{"KUBEVIRT_IO_TEST_TEST": "kubevirt.io/test-test", "A_B_KUBEVIRT_IO_C": "a.b.kubevirt.io/c"} {
		if got := envLabelKey(env); got != key {
			t.Errorf("envLabelKey(%q) = %q, want %q", env, got, key)
		}
	}
}
