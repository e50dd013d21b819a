package storage

import (
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestDefaultClass(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	class := func(name string, age time.Duration, annotations ...string) storagev1.StorageClass {
		ann := map[string]string{}
		for _, a := range annotations {
			ann[a] = "true"
		}
		return storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(-age)), Annotations: ann}}
	}
	def, virt := cdiv1.AnnDefaultStorageClass, cdiv1.AnnDefaultVirtStorageClass
	notTrue := class("not-true", 0)
	notTrue.Annotations[def] = "false"
	tests := []struct {
		name       string
		classes    []storagev1.StorageClass
		wantK8s    string
		wantVirt   string
		wantForDVs string
	}{
		{"no classes", nil, "", "", ""},
		{"no class marked", []storagev1.StorageClass{class("a", 0), class("b", 0)}, "", "", ""},
		{"an annotation other than true does not count", []storagev1.StorageClass{notTrue}, "", "", ""},
		{"one default", []storagev1.StorageClass{class("a", 0), class("b", time.Hour, def)}, "b", "", "b"},
		{"the newest default wins, wherever it is in the list", []storagev1.StorageClass{class("new", 0, def), class("old", time.Hour, def)}, "new", "", "new"},
		{"the newest default wins, listed last", []storagev1.StorageClass{class("old", time.Hour, def), class("new", 0, def)}, "new", "", "new"},
		{"a tie goes to the first name", []storagev1.StorageClass{class("z", 0, def), class("m", 0, def), class("old", time.Hour, def)}, "m", "", "m"},
		{"the virt default wins for DataVolumes", []storagev1.StorageClass{class("k8s", 0, def), class("virt", time.Hour, virt)}, "k8s", "virt", "virt"},
		{"the newest virt default wins", []storagev1.StorageClass{class("virt-old", time.Hour, virt), class("virt-new", time.Minute, virt), class("k8s", 0, def)}, "k8s", "virt-new", "virt-new"},
		{"a virt default tie goes to the first name", []storagev1.StorageClass{class("vb", 0, virt), class("va", 0, virt)}, "", "va", "va"},
		{"one class marked both ways", []storagev1.StorageClass{class("both", 0, def, virt), class("k8s", 0, def)}, "both", "both", "both"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DefaultClassName(tt.classes); got != tt.wantK8s {
				t.Errorf("DefaultClassName = %q, want %q", got, tt.wantK8s)
			}
			if got := VirtDefaultClassName(tt.classes); got != tt.wantVirt {
				t.Errorf("VirtDefaultClassName = %q, want %q", got, tt.wantVirt)
			}
			if got := DataVolumeClassName(tt.classes); got != tt.wantForDVs {
				t.Errorf("DataVolumeClassName = %q, want %q", got, tt.wantForDVs)
			}
		})
	}
}
