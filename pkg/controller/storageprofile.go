package controller

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// LocalTestDriver is the CSI driver of Kubefill's own test clusters
// (tests/csi/hostpath). It serves both volume modes, one node at a time.
const LocalTestDriver = "hostpath.csi.kubefill.test"

// AnnDefaultSnapshotClass marks the default VolumeSnapshotClass of a driver.
const AnnDefaultSnapshotClass = "snapshot.storage.k8s.io/is-default-class"

// Reasons of the StorageProfile Recognized condition.
const (
	ReasonKnownProvisioner        = "KnownProvisioner"
	ReasonUserClaimPropertySets   = "UserClaimPropertySets"
	ReasonUnknownProvisioner      = "UnknownProvisioner"
	ReasonInvalidClaimPropertySet = "InvalidClaimPropertySets"
	ReasonStaticVolumes           = "StaticVolumes"
)

// NoProvisioner is the provisioner of classes whose volumes are made by hand.
const NoProvisioner = "kubernetes.io/no-provisioner"

// conflictRetry is how soon a reconcile that lost an update race runs again.
const conflictRetry = 200 * time.Millisecond

// -----------------------------------------------------------------------------
// The known-provisioner table.
// -----------------------------------------------------------------------------

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

// accessModeRank and volumeModeRank order derived claim properties: shared
// access and raw block first, as the table does.
var (
	accessModeRank = map[corev1.PersistentVolumeAccessMode]int{
		corev1.ReadWriteMany: 0, corev1.ReadWriteOnce: 1, corev1.ReadOnlyMany: 2, corev1.ReadWriteOncePod: 3,
	}
	volumeModeRank = map[corev1.PersistentVolumeMode]int{corev1.PersistentVolumeBlock: 0, corev1.PersistentVolumeFilesystem: 1}
)

// ClaimPropertySetsFromVolumes derives the claim properties of a class
// without a provisioner from the PersistentVolumes made by hand for it: one
// set per access mode and volume mode found, shared access and Block first.
// It returns nil when no volume of the class exists.
func ClaimPropertySetsFromVolumes(className string, pvs []corev1.PersistentVolume) []cdiv1.ClaimPropertySet {
	found := map[volumeAdvice]bool{}
	for i := range pvs {
		if pvs[i].Spec.StorageClassName != className {
			continue
		}
		volumeMode := corev1.PersistentVolumeFilesystem
		if pvs[i].Spec.VolumeMode != nil {
			volumeMode = *pvs[i].Spec.VolumeMode
		}
		for _, m := range pvs[i].Spec.AccessModes {
			found[volumeAdvice{m, volumeMode}] = true
		}
	}
	if len(found) == 0 {
		return nil
	}
	advice := make([]volumeAdvice, 0, len(found))
	for a := range found {
		advice = append(advice, a)
	}
	sort.Slice(advice, func(i, j int) bool {
		if advice[i].mode != advice[j].mode {
			return accessModeRank[advice[i].mode] < accessModeRank[advice[j].mode]
		}
		return volumeModeRank[advice[i].volume] < volumeModeRank[advice[j].volume]
	})
	sets := make([]cdiv1.ClaimPropertySet, 0, len(advice))
	for _, a := range advice {
		volumeMode := a.volume
		sets = append(sets, cdiv1.ClaimPropertySet{AccessModes: []corev1.PersistentVolumeAccessMode{a.mode}, VolumeMode: &volumeMode})
	}
	return sets
}

// -----------------------------------------------------------------------------
// Pure decisions.
// -----------------------------------------------------------------------------

// ParseCloneStrategy reads a clone strategy as the StorageClass annotation
// and the API spell it; ok is false for anything else.
func ParseCloneStrategy(v string) (cdiv1.CDICloneStrategy, bool) {
	switch s := cdiv1.CDICloneStrategy(v); s {
	case cdiv1.CloneStrategyHostAssisted, cdiv1.CloneStrategySnapshot, cdiv1.CloneStrategyCsiClone:
		return s, true
	}
	return "", false
}

// CloneStrategyFor decides a profile's clone strategy. In order: the
// profile's spec; the class annotation cdi.kubevirt.io/clone-strategy (an
// unknown value is ignored); the advice for a known driver; snapshot where
// snapClass (the chosen VolumeSnapshotClass, "" for none) exists; else copy.
// A snapshot strategy without a snapshot class falls back to copy, unless the
// user asked for it in the spec or the annotation. It also returns where the
// choice came from, for logs.
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

// SnapshotClassFor picks the VolumeSnapshotClass for a driver. A class named
// in the spec is used when it exists and serves the driver; otherwise the
// result is "" and note says why. Without a spec name, a matching class
// annotated as the default wins, then the first matching one by name.
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

// validateClaimPropertySets returns an error naming the first set that lacks
// an access mode or a volume mode.
func validateClaimPropertySets(sets []cdiv1.ClaimPropertySet) error {
	for i, set := range sets {
		if len(set.AccessModes) == 0 {
			return fmt.Errorf("spec.claimPropertySets[%d] has no accessModes; give at least one", i)
		}
		if set.VolumeMode == nil || *set.VolumeMode == "" {
			return fmt.Errorf("spec.claimPropertySets[%d] has no volumeMode; give Filesystem or Block", i)
		}
	}
	return nil
}

// ProfileDecision is everything the StorageProfile reconciler writes for one
// class, decided without I/O.
type ProfileDecision struct {
	// Status is the desired status, without Conditions.
	Status cdiv1.StorageProfileStatus
	// Recognized is the desired Recognized condition (no transition time).
	Recognized metav1.Condition
	// Notes are problems with the user's input worth an Event and a log line.
	Notes []string
	// CloneStrategyFrom says where the clone strategy came from.
	CloneStrategyFrom string
}

// DecideStorageProfile computes a profile's status from its class, its spec,
// the VolumeSnapshotClasses in the cluster and, for a class without a
// provisioner, the PersistentVolumes (pvs may be nil for other classes).
func DecideStorageProfile(sc *storagev1.StorageClass, spec cdiv1.StorageProfileSpec, snapshotClasses []snapshotv1.VolumeSnapshotClass, pvs []corev1.PersistentVolume) ProfileDecision {
	var d ProfileDecision
	name, provisioner := sc.Name, sc.Provisioner
	d.Status.StorageClass = &name
	d.Status.Provisioner = &provisioner

	snapClass, note := SnapshotClassFor(provisioner, spec.SnapshotClass, snapshotClasses)
	if note != "" {
		d.Notes = append(d.Notes, note)
	}
	if snapClass != "" {
		d.Status.SnapshotClass = &snapClass
	}
	strategy, from := CloneStrategyFor(spec.CloneStrategy, sc.Annotations, provisioner, sc.Parameters, snapClass)
	d.Status.CloneStrategy = &strategy
	d.CloneStrategyFrom = from
	if v, ok := sc.Annotations[cdiv1.AnnCloneStrategy]; ok && spec.CloneStrategy == nil {
		if _, valid := ParseCloneStrategy(v); !valid {
			d.Notes = append(d.Notes, fmt.Sprintf("StorageClass annotation %s=%q is not one of copy, snapshot, csi-clone; ignored", cdiv1.AnnCloneStrategy, v))
		}
	}
	format := DataImportCronSourceFormatFor(spec.DataImportCronSourceFormat, provisioner, sc.Parameters, snapClass)
	d.Status.DataImportCronSourceFormat = &format

	d.Recognized = metav1.Condition{Type: cdiv1.StorageProfileRecognized}
	switch {
	case len(spec.ClaimPropertySets) > 0:
		if err := validateClaimPropertySets(spec.ClaimPropertySets); err != nil {
			d.Recognized.Status = metav1.ConditionFalse
			d.Recognized.Reason = ReasonInvalidClaimPropertySet
			d.Recognized.Message = err.Error()
			d.Notes = append(d.Notes, err.Error())
			break
		}
		d.Status.ClaimPropertySets = spec.ClaimPropertySets
		d.Recognized.Status = metav1.ConditionTrue
		d.Recognized.Reason = ReasonUserClaimPropertySets
		d.Recognized.Message = "claim properties come from spec.claimPropertySets"
	case provisioner == NoProvisioner:
		d.Status.ClaimPropertySets = ClaimPropertySetsFromVolumes(name, pvs)
		if len(d.Status.ClaimPropertySets) > 0 {
			d.Recognized.Status = metav1.ConditionTrue
			d.Recognized.Reason = ReasonStaticVolumes
			d.Recognized.Message = "claim properties come from the PersistentVolumes of this class"
		} else {
			d.Recognized.Status = metav1.ConditionFalse
			d.Recognized.Reason = ReasonUnknownProvisioner
			d.Recognized.Message = "the class has no provisioner and no PersistentVolumes yet; create PersistentVolumes for it or set spec.claimPropertySets"
		}
	default:
		d.Status.ClaimPropertySets = ClaimPropertySetsFor(provisioner, sc.Parameters)
		if len(d.Status.ClaimPropertySets) > 0 {
			d.Recognized.Status = metav1.ConditionTrue
			d.Recognized.Reason = ReasonKnownProvisioner
			d.Recognized.Message = fmt.Sprintf("claim properties for provisioner %q come from the known-provisioner table", provisioner)
		} else {
			d.Recognized.Status = metav1.ConditionFalse
			d.Recognized.Reason = ReasonUnknownProvisioner
			d.Recognized.Message = fmt.Sprintf("provisioner %q is not in the known-provisioner table; set spec.claimPropertySets (accessModes and volumeMode) so that DataVolumes using spec.storage can be completed", provisioner)
		}
	}
	return d
}

// ProfileMetricLabels are the labels of kubevirt_cdi_storageprofile_info.
func ProfileMetricLabels(sc *storagev1.StorageClass, status cdiv1.StorageProfileStatus, smartClone bool) prometheus.Labels {
	complete := unsupportedProvisioners[sc.Provisioner] || claimPropertySetsComplete(status.ClaimPropertySets)
	rwx := false
	for _, set := range status.ClaimPropertySets {
		if slices.Contains(set.AccessModes, corev1.ReadWriteMany) {
			rwx = true
		}
	}
	strategy := ""
	if status.CloneStrategy != nil {
		strategy = string(*status.CloneStrategy)
	}
	return prometheus.Labels{
		"storageclass":   sc.Name,
		"provisioner":    sc.Provisioner,
		"clone_strategy": strategy,
		"complete":       strconv.FormatBool(complete),
		"default":        strconv.FormatBool(sc.Annotations[cdiv1.AnnDefaultStorageClass] == "true"),
		"virtdefault":    strconv.FormatBool(sc.Annotations[cdiv1.AnnDefaultVirtStorageClass] == "true"),
		"rwx":            strconv.FormatBool(rwx),
		"smartclone":     strconv.FormatBool(smartClone),
		"degraded":       strconv.FormatBool(!rwx || !smartClone),
	}
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

func claimPropertySetsComplete(sets []cdiv1.ClaimPropertySet) bool {
	return len(sets) > 0 && validateClaimPropertySets(sets) == nil
}

// storageProfileInfo is kubevirt_cdi_storageprofile_info: one series per
// StorageClass, value 1, the facts in its labels.
var storageProfileInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "kubevirt_cdi_storageprofile_info",
	Help: "StorageProfiles info labels: storageclass, provisioner, clone_strategy, " +
		"complete (the recommended PVC settings are known), default (the Kubernetes default class), " +
		"virtdefault (the default virtualization class), rwx (ReadWriteMany is supported), " +
		"smartclone (snapshot or CSI clone is possible), degraded (no rwx or no smart clone)",
}, []string{"storageclass", "provisioner", "clone_strategy", "complete", "default", "virtdefault", "rwx", "smartclone", "degraded"})

func init() {
	metrics.Registry.MustRegister(storageProfileInfo)
}

// -----------------------------------------------------------------------------
// The reconciler.
// -----------------------------------------------------------------------------

// volumeSnapshotClassGVK is the kind the reconciler watches when its CRD exists.
var volumeSnapshotClassGVK = schema.GroupVersionKind{Group: snapshotv1.GroupName, Version: "v1", Kind: "VolumeSnapshotClass"}

// StorageProfileReconciler keeps one StorageProfile per StorageClass, named
// after it, and deletes the profile when its class goes.
type StorageProfileReconciler struct {
	Client client.Client
	// Recorder, when set, receives Warning events about bad user input.
	Recorder events.EventRecorder

	// snapshotsServed is set at setup when the VolumeSnapshotClass CRD exists.
	snapshotsServed bool
}

// SetupWithManager registers the reconciler. It watches StorageClasses,
// StorageProfiles and, when that CRD is installed at setup time,
// VolumeSnapshotClasses (a CRD installed later needs a restart).
func (r *StorageProfileReconciler) SetupWithManager(mgr ctrl.Manager) error {
	logger := mgr.GetLogger().WithName("storageprofile")
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	served, err := kindServed(mgr, volumeSnapshotClassGVK)
	if err != nil {
		return err
	}
	r.snapshotsServed = served
	b := ctrl.NewControllerManagedBy(mgr).
		Named("storageprofile").
		For(&storagev1.StorageClass{}).
		Watches(&cdiv1.StorageProfile{}, &handler.EnqueueRequestForObject{}).
		Watches(&corev1.PersistentVolume{}, handler.EnqueueRequestsFromMapFunc(r.staticClassOf)).
		Watches(&storagev1.CSIDriver{}, handler.EnqueueRequestsFromMapFunc(r.classesOfCSIDriver))
	if served {
		if !mgr.GetScheme().Recognizes(volumeSnapshotClassGVK) {
			if err := snapshotv1.AddToScheme(mgr.GetScheme()); err != nil {
				return fmt.Errorf("adding snapshot.storage.k8s.io/v1 to the scheme: %w", err)
			}
		}
		b = b.Watches(&snapshotv1.VolumeSnapshotClass{}, handler.EnqueueRequestsFromMapFunc(r.classesOfDriver))
		logger.Info("watching VolumeSnapshotClasses")
	} else {
		logger.Info("VolumeSnapshotClass CRD not installed; every profile without a spec clone strategy gets copy")
	}
	if err := b.Complete(r); err != nil {
		return fmt.Errorf("building the StorageProfile controller: %w", err)
	}
	return nil
}

// kindServed asks the manager's RESTMapper whether the API serves gvk.
func kindServed(mgr ctrl.Manager, gvk schema.GroupVersionKind) (bool, error) {
	_, err := mgr.GetRESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
	switch {
	case err == nil:
		return true, nil
	case meta.IsNoMatchError(err):
		return false, nil
	}
	return false, fmt.Errorf("looking up %s in the API: %w", gvk, err)
}

// staticClassOf maps a PersistentVolume to its class when that class has no
// provisioner, the only case where volumes shape a profile.
func (r *StorageProfileReconciler) staticClassOf(ctx context.Context, obj client.Object) []reconcile.Request {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.StorageClassName == "" {
		return nil
	}
	sc := &storagev1.StorageClass{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: pv.Spec.StorageClassName}, sc); err != nil || sc.Provisioner != NoProvisioner {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: sc.Name}}}
}

// classesOfCSIDriver maps a CSIDriver to the classes it provisions for:
// whether it is registered decides if csi-clone counts as a smart clone.
func (r *StorageProfileReconciler) classesOfCSIDriver(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.classesWithProvisioner(ctx, obj.GetName())
}

// classesWithProvisioner lists the StorageClasses of one provisioner as requests.
func (r *StorageProfileReconciler) classesWithProvisioner(ctx context.Context, provisioner string) []reconcile.Request {
	var classes storagev1.StorageClassList
	if err := r.Client.List(ctx, &classes); err != nil {
		log.FromContext(ctx).Error(err, "listing StorageClasses", "provisioner", provisioner)
		return nil
	}
	var reqs []reconcile.Request
	for _, sc := range classes.Items {
		if sc.Provisioner == provisioner {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: sc.Name}})
		}
	}
	return reqs
}

// classesOfDriver maps a VolumeSnapshotClass to the StorageClasses of its
// driver, plus every class whose profile names it in spec.snapshotClass.
func (r *StorageProfileReconciler) classesOfDriver(ctx context.Context, obj client.Object) []reconcile.Request {
	vsc, ok := obj.(*snapshotv1.VolumeSnapshotClass)
	if !ok {
		return nil
	}
	var classes storagev1.StorageClassList
	if err := r.Client.List(ctx, &classes); err != nil {
		log.FromContext(ctx).Error(err, "listing StorageClasses for a VolumeSnapshotClass change", "volumeSnapshotClass", vsc.Name)
		return nil
	}
	var profiles cdiv1.StorageProfileList
	if err := r.Client.List(ctx, &profiles); err != nil {
		log.FromContext(ctx).Error(err, "listing StorageProfiles for a VolumeSnapshotClass change", "volumeSnapshotClass", vsc.Name)
	}
	named := map[string]bool{}
	for _, p := range profiles.Items {
		if p.Spec.SnapshotClass != nil && *p.Spec.SnapshotClass == vsc.Name {
			named[p.Name] = true
		}
	}
	var reqs []reconcile.Request
	for _, sc := range classes.Items {
		if sc.Provisioner == vsc.Driver || named[sc.Name] {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: sc.Name}})
		}
	}
	return reqs
}

// Reconcile brings the StorageProfile named req.Name in line with its class.
func (r *StorageProfileReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx).WithValues("storageClass", req.Name)

	// Read.
	sc := &storagev1.StorageClass{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: req.Name}, sc); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, r.deleteProfile(ctx, logger, req.Name)
		}
		return ctrl.Result{}, fmt.Errorf("reading StorageClass %s: %w", req.Name, err)
	}
	if sc.DeletionTimestamp != nil {
		return ctrl.Result{}, r.deleteProfile(ctx, logger, req.Name)
	}
	profile := &cdiv1.StorageProfile{}
	exists := true
	if err := r.Client.Get(ctx, types.NamespacedName{Name: sc.Name}, profile); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("reading StorageProfile %s: %w", sc.Name, err)
		}
		exists = false
	}
	var snapshotClasses []snapshotv1.VolumeSnapshotClass
	if r.snapshotsServed {
		var list snapshotv1.VolumeSnapshotClassList
		if err := r.Client.List(ctx, &list); err != nil {
			return ctrl.Result{}, fmt.Errorf("listing VolumeSnapshotClasses: %w", err)
		}
		snapshotClasses = list.Items
	}

	var pvs []corev1.PersistentVolume
	if sc.Provisioner == NoProvisioner && len(profile.Spec.ClaimPropertySets) == 0 {
		var list corev1.PersistentVolumeList
		if err := r.Client.List(ctx, &list); err != nil {
			return ctrl.Result{}, fmt.Errorf("listing PersistentVolumes for class %s without a provisioner: %w", sc.Name, err)
		}
		pvs = list.Items
	}

	// Decide.
	d := DecideStorageProfile(sc, profile.Spec, snapshotClasses, pvs)

	// Act.
	if !exists {
		profile = &cdiv1.StorageProfile{
			ObjectMeta: metav1.ObjectMeta{
				Name:   sc.Name,
				Labels: map[string]string{cdiv1.LabelApp: cdiv1.LabelAppValue, cdiv1.LabelAppManagedBy: "kubefill"},
			},
		}
		if err := r.Client.Create(ctx, profile); err != nil {
			if apierrors.IsAlreadyExists(err) {
				// Created meanwhile (the cache lags): the retry decides on what is there.
				return ctrl.Result{}, fmt.Errorf("creating StorageProfile %s: it appeared meanwhile, retrying: %w", sc.Name, err)
			}
			return ctrl.Result{}, fmt.Errorf("creating StorageProfile %s: %w", sc.Name, err)
		}
		logger.Info("created StorageProfile")
	}
	desired := profile.Status.DeepCopy()
	conditions := desired.Conditions
	*desired = d.Status
	desired.Conditions = conditions
	d.Recognized.ObservedGeneration = profile.Generation
	meta.SetStatusCondition(&desired.Conditions, d.Recognized)
	if !equality.Semantic.DeepEqual(*desired, profile.Status) {
		profile.Status = *desired
		if err := r.Client.Status().Update(ctx, profile); err != nil {
			if apierrors.IsConflict(err) {
				// The cache was behind the object; decide again on a fresh read.
				logger.V(1).Info("StorageProfile changed since read; retrying")
				return ctrl.Result{RequeueAfter: conflictRetry}, nil
			}
			return ctrl.Result{}, fmt.Errorf("updating StorageProfile %s status: %w", sc.Name, err)
		}
		logger.Info("updated StorageProfile status", "cloneStrategy", *d.Status.CloneStrategy, "cloneStrategyFrom", d.CloneStrategyFrom,
			"snapshotClass", ptrString(d.Status.SnapshotClass), "claimPropertySets", len(d.Status.ClaimPropertySets), "recognized", d.Recognized.Reason)
		for _, note := range d.Notes {
			logger.Info("StorageProfile input problem", "problem", note)
			if r.Recorder != nil {
				r.Recorder.Eventf(profile, nil, corev1.EventTypeWarning, "InvalidConfiguration", "Reconcile", "%s", note)
			}
		}
	}

	csiDriverExists := false
	if d.Status.CloneStrategy != nil && *d.Status.CloneStrategy == cdiv1.CloneStrategyCsiClone {
		driver := &storagev1.CSIDriver{}
		err := r.Client.Get(ctx, types.NamespacedName{Name: sc.Provisioner}, driver)
		switch {
		case err == nil:
			csiDriverExists = true
		case !apierrors.IsNotFound(err):
			return ctrl.Result{}, fmt.Errorf("reading CSIDriver %s: %w", sc.Provisioner, err)
		}
	}
	setProfileMetric(ProfileMetricLabels(sc, d.Status, SmartCloneFor(d.Status, csiDriverExists)))
	return ctrl.Result{}, nil
}

// setProfileMetric replaces the series of one StorageClass.
func setProfileMetric(labels prometheus.Labels) {
	storageProfileInfo.DeletePartialMatch(prometheus.Labels{"storageclass": labels["storageclass"]})
	storageProfileInfo.With(labels).Set(1)
}

// deleteProfile removes the profile and metric series of a deleted class.
func (r *StorageProfileReconciler) deleteProfile(ctx context.Context, logger logr.Logger, name string) error {
	storageProfileInfo.DeletePartialMatch(prometheus.Labels{"storageclass": name})
	profile := &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := r.Client.Delete(ctx, profile); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("deleting StorageProfile %s of a deleted StorageClass: %w", name, err)
	}
	logger.Info("deleted StorageProfile of a deleted StorageClass")
	return nil
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
