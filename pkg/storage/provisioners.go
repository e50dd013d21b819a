package storage

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// The known-provisioner table: what Kubefill knows about each storage driver
// without asking it. Every decision in this package that depends on the
// driver reads it through provisionerKey.

// LocalTestDriver is the CSI driver of Kubefill's own test clusters
// (tests/csi/hostpath). It serves both volume modes, one node at a time.
const LocalTestDriver = "hostpath.csi.kubefill.test"

// NoProvisioner is the provisioner of classes whose volumes are made by hand.
const NoProvisioner = "kubernetes.io/no-provisioner"

// volumeAdvice is one access mode with one volume mode, as the table holds it.
type volumeAdvice struct {
	mode   corev1.PersistentVolumeAccessMode
	volume corev1.PersistentVolumeMode
}

var (
	rwoBlock = volumeAdvice{corev1.ReadWriteOnce, corev1.PersistentVolumeBlock}
	rwoFS    = volumeAdvice{corev1.ReadWriteOnce, corev1.PersistentVolumeFilesystem}
	rwxBlock = volumeAdvice{corev1.ReadWriteMany, corev1.PersistentVolumeBlock}
	rwxFS    = volumeAdvice{corev1.ReadWriteMany, corev1.PersistentVolumeFilesystem}
	roxBlock = volumeAdvice{corev1.ReadOnlyMany, corev1.PersistentVolumeBlock}
	roxFS    = volumeAdvice{corev1.ReadOnlyMany, corev1.PersistentVolumeFilesystem}
)

// Advice shapes several drivers share, best first.
var (
	sharedBlockFirst = []volumeAdvice{rwxBlock, rwoBlock, rwoFS}
	rwoBoth          = []volumeAdvice{rwoBlock, rwoFS}
	fileOnly         = []volumeAdvice{rwxFS, rwoFS, roxFS}
	allButSharedFS   = []volumeAdvice{rwxBlock, rwoBlock, rwoFS, roxBlock, roxFS}
	dellBlock        = []volumeAdvice{rwxBlock, rwoBlock, rwoFS, roxBlock}
)

// adviceByKey maps a provisioner key (the provisioner name, or name/variant
// where the class parameters pick a variant, see provisionerKey) to the
// claim properties that work with it, best first.
var adviceByKey = map[string][]volumeAdvice{
	LocalTestDriver: {rwoFS, rwoBlock},

	// Host path.
	"kubevirt.io.hostpath-provisioner": {rwoFS},
	"kubevirt.io/hostpath-provisioner": {rwoFS},
	"k8s.io/minikube-hostpath":         {rwoFS},
	"rancher.io/local-path":            {rwoFS},

	// NFS.
	"nfs.csi.k8s.io": {rwxFS},
	"k8s-sigs.io/nfs-subdir-external-provisioner": {rwxFS},

	// Ceph.
	"kubernetes.io/rbd":                     sharedBlockFirst,
	"rbd.csi.ceph.com":                      sharedBlockFirst,
	"rook-ceph.rbd.csi.ceph.com":            sharedBlockFirst,
	"openshift-storage.rbd.csi.ceph.com":    sharedBlockFirst,
	"cephfs.csi.ceph.com":                   {rwxFS},
	"rook-ceph.cephfs.csi.ceph.com":         {rwxFS},
	"openshift-storage.cephfs.csi.ceph.com": {rwxFS},

	// LVM and friends.
	"topolvm.io":             rwoBoth,
	"topolvm.cybozu.com":     rwoBoth,
	"linstor.csi.linbit.com": allButSharedFS,
	"kubesan.gitlab.io":      {rwxBlock, roxBlock, rwoBlock, rwoFS},

	// Clouds.
	"kubernetes.io/aws-ebs":           {rwoBlock},
	"ebs.csi.aws.com":                 {rwoBlock},
	"ebs.csi.aws.com/io1":             {rwoBlock},
	"ebs.csi.aws.com/io2":             sharedBlockFirst,
	"ebs.csi.aws.com/gp":              {rwoBlock},
	"efs.csi.aws.com":                 {rwxFS, rwoFS},
	"kubernetes.io/azure-disk":        {rwoBlock},
	"disk.csi.azure.com":              {rwoBlock},
	"kubernetes.io/azure-file":        {rwxFS},
	"file.csi.azure.com":              {rwxFS},
	"kubernetes.io/gce-pd":            {rwoBlock},
	"pd.csi.storage.gke.io":           {rwoBlock},
	"pd.csi.storage.gke.io/hyperdisk": sharedBlockFirst,
	"cinder.csi.openstack.org":        rwoBoth,
	"manila.csi.openstack.org":        {rwxFS},
	"blockvolume.csi.oraclecloud.com": sharedBlockFirst,
	"csi.ovirt.org":                   rwoBoth,

	// vSphere.
	"csi.vsphere.vmware.com":     {rwoBlock, rwoFS},
	"csi.vsphere.vmware.com/nfs": {rwxFS, rwoBlock, rwoFS},

	// NetApp Trident: only the ONTAP backends are known.
	"csi.trident.netapp.io/ontap-nas": {rwxFS, rwoFS},
	"csi.trident.netapp.io/ontap-san": {rwxBlock},

	// Longhorn.
	"driver.longhorn.io":            {rwoBlock},
	"driver.longhorn.io/migratable": {rwxBlock, rwoBlock},
	"driver.longhorn.io/nfs":        {rwxFS, rwoFS},
	"driver.longhorn.io/fs":         {rwoFS},

	// Portworx.
	"kubernetes.io/portworx-volume":     {rwxBlock, rwxFS, rwoBlock, rwoFS},
	"kubernetes.io/portworx-volume/nfs": {rwxFS, rwoFS},
	"pxd.portworx.com":                  {rwxBlock, rwxFS, rwoBlock, rwoFS},
	"pxd.portworx.com/nfs":              {rwxFS, rwoFS},

	// Dell.
	"csi-unity.dellemc.com":          allButSharedFS,
	"csi-unity.dellemc.com/nfs":      fileOnly,
	"csi-vxflexos.dellemc.com":       allButSharedFS,
	"csi-vxflexos.dellemc.com/nfs":   fileOnly,
	"csi-isilon.dellemc.com":         fileOnly,
	"csi-powermax.dellemc.com":       dellBlock,
	"csi-powermax.dellemc.com/nfs":   fileOnly,
	"csi-powerstore.dellemc.com":     dellBlock,
	"csi-powerstore.dellemc.com/nfs": fileOnly,

	// Other arrays.
	"hspc.csi.hitachi.com":      sharedBlockFirst,
	"csi.hpe.com":               sharedBlockFirst,
	"block.csi.ibm.com":         sharedBlockFirst,
	"spectrumscale.csi.ibm.com": {rwxFS, rwoFS},
	"csi.huawei.com":            allButSharedFS,
	"csi.huawei.com/nfs":        fileOnly,
	"kubernetes.io/storageos":   {rwoFS},
	"storageos":                 {rwoFS},
}

// advisedCloneStrategyByKey holds drivers whose best clone strategy is known
// to differ from the default choice (snapshot where a VolumeSnapshotClass
// exists). A snapshot advice still needs a VolumeSnapshotClass.
var advisedCloneStrategyByKey = map[string]cdiv1.CDICloneStrategy{
	"rook-ceph.rbd.csi.ceph.com":            cdiv1.CloneStrategyCsiClone,
	"openshift-storage.rbd.csi.ceph.com":    cdiv1.CloneStrategyCsiClone,
	"cephfs.csi.ceph.com":                   cdiv1.CloneStrategyCsiClone,
	"openshift-storage.cephfs.csi.ceph.com": cdiv1.CloneStrategyCsiClone,
	"topolvm.io":                            cdiv1.CloneStrategyHostAssisted,
	"topolvm.cybozu.com":                    cdiv1.CloneStrategyHostAssisted,
	"csi-powerstore.dellemc.com":            cdiv1.CloneStrategyHostAssisted,
	"csi-vxflexos.dellemc.com":              cdiv1.CloneStrategyCsiClone,
	"csi-isilon.dellemc.com":                cdiv1.CloneStrategyCsiClone,
	"csi-powermax.dellemc.com":              cdiv1.CloneStrategyCsiClone,
	"hspc.csi.hitachi.com":                  cdiv1.CloneStrategyCsiClone,
	"csi.hpe.com":                           cdiv1.CloneStrategyCsiClone,
	"block.csi.ibm.com":                     cdiv1.CloneStrategyCsiClone,
	"spectrumscale.csi.ibm.com":             cdiv1.CloneStrategyCsiClone,
	"pxd.portworx.com":                      cdiv1.CloneStrategyCsiClone,
	"pxd.portworx.com/nfs":                  cdiv1.CloneStrategyCsiClone,
	"kubesan.gitlab.io":                     cdiv1.CloneStrategyCsiClone,
	"csi.trident.netapp.io/ontap-nas":       cdiv1.CloneStrategySnapshot,
	"csi.trident.netapp.io/ontap-san":       cdiv1.CloneStrategySnapshot,
	"pd.csi.storage.gke.io":                 cdiv1.CloneStrategySnapshot,
	"pd.csi.storage.gke.io/hyperdisk":       cdiv1.CloneStrategySnapshot,
}

// snapshotSourceFormatKeys are drivers that scale better when DataImportCrons
// keep their images as VolumeSnapshots.
var snapshotSourceFormatKeys = map[string]bool{
	"rook-ceph.rbd.csi.ceph.com":         true,
	"openshift-storage.rbd.csi.ceph.com": true,
	"csi.trident.netapp.io/ontap-nas":    true,
	"csi.trident.netapp.io/ontap-san":    true,
	"pd.csi.storage.gke.io":              true,
	"pd.csi.storage.gke.io/hyperdisk":    true,
}

// unsupportedProvisioners do not make block or file volumes at all (object
// buckets, snapshot shims); their profiles count as complete for the metric.
var unsupportedProvisioners = map[string]bool{
	"openshift-storage.noobaa.io/obc":       true,
	"openshift-storage.ceph.rook.io/bucket": true,
	"rook-ceph.ceph.rook.io/bucket":         true,
	"stork-snapshot":                        true,
}

// csiFSType is the class parameter naming the filesystem of CSI volumes.
const csiFSType = "csi.storage.k8s.io/fstype"

// splitList splits a parameter holding a list separated by commas or
// semicolons, trimming blanks.
func splitList(v string) []string {
	fields := strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ';' })
	for i := range fields {
		fields[i] = strings.TrimSpace(fields[i])
	}
	return fields
}

// nfsV3NoLock reports Portworx's sharedv4 NFS export settings.
func nfsV3NoLock(params map[string]string) bool {
	opts := splitList(params["sharedv4_mount_options"])
	return slices.Contains(opts, "vers=3.0") && slices.Contains(opts, "nolock")
}

// provisionerKey picks the table key for a class: the provisioner name, or
// a variant of it where the class parameters change what the driver serves.
// An empty result means the driver is known but this variant is not.
func provisionerKey(provisioner string, params map[string]string) string {
	lower := func(k string) string { return strings.ToLower(params[k]) }
	switch provisioner {
	case "ebs.csi.aws.com":
		switch params["type"] {
		case "io1":
			return provisioner + "/io1"
		case "io2":
			return provisioner + "/io2"
		case "gp2", "gp3":
			return provisioner + "/gp"
		}
	case "pd.csi.storage.gke.io":
		switch params["type"] {
		case "hyperdisk-balanced", "hyperdisk-balanced-high-availability":
			return provisioner + "/hyperdisk"
		}
	case "csi.trident.netapp.io":
		switch backend := params["backendType"]; {
		case strings.HasPrefix(backend, "ontap-nas"):
			return provisioner + "/ontap-nas"
		case strings.HasPrefix(backend, "ontap-san"):
			return provisioner + "/ontap-san"
		}
		return ""
	case "driver.longhorn.io":
		switch {
		case params["migratable"] == "true":
			return provisioner + "/migratable"
		case params["nfsOptions"] != "":
			return provisioner + "/nfs"
		case params["fsType"] != "":
			return provisioner + "/fs"
		}
	case "kubernetes.io/portworx-volume":
		if nfsV3NoLock(params) {
			return provisioner + "/nfs"
		}
	case "pxd.portworx.com":
		if _, ok := params["backend"]; ok {
			// The Pure backends are variants this table does not hold.
			return ""
		}
		if nfsV3NoLock(params) {
			return provisioner + "/nfs"
		}
	case "csi.vsphere.vmware.com":
		if strings.Contains(lower(csiFSType), "nfs") {
			return provisioner + "/nfs"
		}
	case "csi-powerstore.dellemc.com", "csi-vxflexos.dellemc.com", "csi-powermax.dellemc.com":
		if lower(csiFSType) == "nfs" {
			return provisioner + "/nfs"
		}
	case "csi-unity.dellemc.com", "csi.huawei.com":
		if lower("protocol") == "nfs" {
			return provisioner + "/nfs"
		}
	}
	return provisioner
}

// ClaimPropertySetsFor returns the claim properties known to work with a
// provisioner and its class parameters, best first, one access mode per set.
// It returns nil for a provisioner the table does not know; the user then
// fills spec.claimPropertySets.
func ClaimPropertySetsFor(provisioner string, params map[string]string) []cdiv1.ClaimPropertySet {
	advice := adviceByKey[provisionerKey(provisioner, params)]
	if len(advice) == 0 {
		return nil
	}
	sets := make([]cdiv1.ClaimPropertySet, 0, len(advice))
	for _, a := range advice {
		volumeMode := a.volume
		sets = append(sets, cdiv1.ClaimPropertySet{
			AccessModes: []corev1.PersistentVolumeAccessMode{a.mode},
			VolumeMode:  &volumeMode,
		})
	}
	return sets
}

// Unsupported reports a provisioner that makes no block or file volumes at
// all (object buckets, snapshot shims): nothing is left to configure on its
// profiles.
func Unsupported(provisioner string) bool { return unsupportedProvisioners[provisioner] }
