package storage

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// sets renders claim property sets compactly, e.g. "RWX/Block RWO/Filesystem".
func sets(s []cdiv1.ClaimPropertySet) string {
	short := map[corev1.PersistentVolumeAccessMode]string{
		corev1.ReadWriteOnce: "RWO", corev1.ReadWriteMany: "RWX", corev1.ReadOnlyMany: "ROX", corev1.ReadWriteOncePod: "RWOP",
	}
	var parts []string
	for _, set := range s {
		var modes []string
		for _, m := range set.AccessModes {
			modes = append(modes, short[m])
		}
		vm := "<nil>"
		if set.VolumeMode != nil {
			vm = string(*set.VolumeMode)
		}
		parts = append(parts, strings.Join(modes, ",")+"/"+vm)
	}
	return strings.Join(parts, " ")
}

func TestClaimPropertySetsFor(t *testing.T) {
	tests := []struct {
		provisioner string
		params      map[string]string
		want        string
	}{
		{"rook-ceph.rbd.csi.ceph.com", nil, "RWX/Block RWO/Block RWO/Filesystem"},
		{"rbd.csi.ceph.com", map[string]string{"pool": "x"}, "RWX/Block RWO/Block RWO/Filesystem"},
		{"cephfs.csi.ceph.com", nil, "RWX/Filesystem"},
		{"kubevirt.io.hostpath-provisioner", nil, "RWO/Filesystem"},
		{"kubevirt.io/hostpath-provisioner", nil, "RWO/Filesystem"},
		{"topolvm.io", nil, "RWO/Block RWO/Filesystem"},
		{"topolvm.cybozu.com", nil, "RWO/Block RWO/Filesystem"},
		{"nfs.csi.k8s.io", nil, "RWX/Filesystem"},
		{"pd.csi.storage.gke.io", nil, "RWO/Block"},
		{"pd.csi.storage.gke.io", map[string]string{"type": "pd-ssd"}, "RWO/Block"},
		{"pd.csi.storage.gke.io", map[string]string{"type": "hyperdisk-balanced"}, "RWX/Block RWO/Block RWO/Filesystem"},
		{"ebs.csi.aws.com", nil, "RWO/Block"},
		{"ebs.csi.aws.com", map[string]string{"type": "io2"}, "RWX/Block RWO/Block RWO/Filesystem"},
		{"ebs.csi.aws.com", map[string]string{"type": "gp3"}, "RWO/Block"},
		{"disk.csi.azure.com", nil, "RWO/Block"},
		{"file.csi.azure.com", nil, "RWX/Filesystem"},
		{"efs.csi.aws.com", nil, "RWX/Filesystem RWO/Filesystem"},
		{"csi.trident.netapp.io", map[string]string{"backendType": "ontap-nas-economy"}, "RWX/Filesystem RWO/Filesystem"},
		{"csi.trident.netapp.io", map[string]string{"backendType": "ontap-san"}, "RWX/Block"},
		{"csi.trident.netapp.io", map[string]string{"backendType": "solidfire-san"}, ""},
		{"csi.trident.netapp.io", nil, ""},
		{"driver.longhorn.io", nil, "RWO/Block"},
		{"driver.longhorn.io", map[string]string{"migratable": "true"}, "RWX/Block RWO/Block"},
		{"driver.longhorn.io", map[string]string{"nfsOptions": "vers=4.2"}, "RWX/Filesystem RWO/Filesystem"},
		{"driver.longhorn.io", map[string]string{"fsType": "ext4"}, "RWO/Filesystem"},
		{"pxd.portworx.com", nil, "RWX/Block RWX/Filesystem RWO/Block RWO/Filesystem"},
		{"pxd.portworx.com", map[string]string{"sharedv4_mount_options": "vers=3.0, nolock"}, "RWX/Filesystem RWO/Filesystem"},
		{"pxd.portworx.com", map[string]string{"backend": "pure_block"}, ""},
		{"csi.vsphere.vmware.com", nil, "RWO/Block RWO/Filesystem"},
		{"csi.vsphere.vmware.com", map[string]string{"csi.storage.k8s.io/fstype": "NFS4"}, "RWX/Filesystem RWO/Block RWO/Filesystem"},
		{"csi-powerstore.dellemc.com", nil, "RWX/Block RWO/Block RWO/Filesystem ROX/Block"},
		{"csi-powerstore.dellemc.com", map[string]string{"csi.storage.k8s.io/fstype": "nfs"}, "RWX/Filesystem RWO/Filesystem ROX/Filesystem"},
		{"csi-unity.dellemc.com", map[string]string{"protocol": "NFS"}, "RWX/Filesystem RWO/Filesystem ROX/Filesystem"},
		{"linstor.csi.linbit.com", nil, "RWX/Block RWO/Block RWO/Filesystem ROX/Block ROX/Filesystem"},
		{"kubesan.gitlab.io", nil, "RWX/Block ROX/Block RWO/Block RWO/Filesystem"},
		{LocalTestDriver, nil, "RWO/Filesystem RWO/Block"},
		{"example.com/unknown", nil, ""},
		{"kubernetes.io/no-provisioner", nil, ""},
		{"", nil, ""},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s%v", tt.provisioner, tt.params), func(t *testing.T) {
			got := ClaimPropertySetsFor(tt.provisioner, tt.params)
			if sets(got) != tt.want {
				t.Errorf("ClaimPropertySetsFor(%q, %v) = %q, want %q", tt.provisioner, tt.params, sets(got), tt.want)
			}
			if tt.want == "" && got != nil {
				t.Errorf("unknown provisioner gave non-nil %#v", got)
			}
		})
	}
}

// TestClaimPropertySetsForReturnsFreshSlices checks that callers cannot
// corrupt the table through a result.
func TestClaimPropertySetsForReturnsFreshSlices(t *testing.T) {
	a := ClaimPropertySetsFor(LocalTestDriver, nil)
	*a[0].VolumeMode = corev1.PersistentVolumeBlock
	a[0].AccessModes[0] = corev1.ReadOnlyMany
	if b := ClaimPropertySetsFor(LocalTestDriver, nil); sets(b) != "RWO/Filesystem RWO/Block" {
		t.Fatalf("table changed through a result: %s", sets(b))
	}
}

func TestTableEntriesAreValid(t *testing.T) {
	for key, advice := range adviceByKey {
		if len(advice) == 0 || len(advice) > 8 {
			t.Errorf("%s: %d sets, the API allows 1 to 8", key, len(advice))
		}
		seen := map[volumeAdvice]bool{}
		for _, a := range advice {
			if seen[a] {
				t.Errorf("%s: duplicate %v", key, a)
			}
			seen[a] = true
		}
	}
}

func pv(name, class string, volumeMode *corev1.PersistentVolumeMode, modes ...corev1.PersistentVolumeAccessMode) corev1.PersistentVolume {
	return corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PersistentVolumeSpec{StorageClassName: class, VolumeMode: volumeMode, AccessModes: modes},
	}
}

func TestClaimPropertySetsFromVolumes(t *testing.T) {
	block, fs := corev1.PersistentVolumeBlock, corev1.PersistentVolumeFilesystem
	tests := []struct {
		name string
		pvs  []corev1.PersistentVolume
		want string
	}{
		{"none", nil, ""},
		{"only other classes", []corev1.PersistentVolume{pv("a", "other", nil, corev1.ReadWriteOnce)}, ""},
		{"unset volume mode is Filesystem", []corev1.PersistentVolume{pv("a", "local", nil, corev1.ReadWriteOnce)}, "RWO/Filesystem"},
		{
			"deduplicated and ordered shared-first, Block-first",
			[]corev1.PersistentVolume{
				pv("a", "local", &fs, corev1.ReadWriteOnce),
				pv("b", "local", &block, corev1.ReadWriteOnce, corev1.ReadWriteMany),
				pv("c", "local", &fs, corev1.ReadWriteOnce),
				pv("d", "local", &fs, corev1.ReadOnlyMany),
			},
			"RWX/Block RWO/Block RWO/Filesystem ROX/Filesystem",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sets(ClaimPropertySetsFromVolumes("local", tt.pvs)); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
