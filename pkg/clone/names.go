package clone

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

// CDI's names of a clone's temporary objects, all in the source's namespace.

// TmpClaimName is the clone's prime: tmp-pvc-<target UID>.
func TmpClaimName(target types.UID) string { return "tmp-pvc-" + string(target) }

// TargetOfTmpClaim is the target UID a prime's name (TmpClaimName) holds;
// empty for another name.
func TargetOfTmpClaim(name string) types.UID {
	uid, ok := strings.CutPrefix(name, "tmp-pvc-")
	if !ok {
		return ""
	}
	return types.UID(uid)
}

// TmpSnapshotName is the VolumeSnapshot a snapshot clone of a claim takes.
func TmpSnapshotName(target types.UID) string { return "tmp-snapshot-" + string(target) }

// TmpSourceClaimName is the restore of a source snapshot that a
// host-assisted copy reads.
func TmpSourceClaimName(target types.UID) string { return "tmp-source-pvc-" + string(target) }

// SourcePodName is the host-assisted clone's source pod (and its client
// certificate Secret).
func SourcePodName(target types.UID) string { return string(target) + "-source-pod" }

// UploadClientName is the common name of the clone source pod's client
// certificate, which the upload server of the clone requires:
// <srcNs>/<srcName>-<uploadNs>/<uploadClaim>, CDI's value (the upload
// target is the clone's prime, named after the target's UID, so the name
// binds the stream to this one clone).
func UploadClientName(sourceNamespace, sourceName, uploadNamespace, uploadClaim string) string {
	return sourceNamespace + "/" + sourceName + "-" + uploadNamespace + "/" + uploadClaim
}

// UploadURL is where the source pod sends the stream: the upload
// Service's cluster IP and port, so that a clone needs no cluster DNS (the
// pod's certificate is checked against UploadServerName).
func UploadURL(serviceIP string) string {
	return "https://" + net.JoinHostPort(serviceIP, strconv.Itoa(contract.UploadServicePort)) + contract.CloneUploadPath
}

// UploadServerName is the name on the upload pod's serving certificate:
// its Service's, <service>.<namespace>.svc.
func UploadServerName(service, namespace string) string {
	return service + "." + namespace + ".svc"
}

// The clone source pod's environment (pkg/contract: CDI's names, plus
// UPLOAD_SERVER_NAME).
const (
	envVolumeMode       = contract.EnvCloneVolumeMode
	envMountPoint       = contract.EnvCloneMountPoint
	envUploadURL        = contract.EnvCloneUploadURL
	envUploadServerName = contract.EnvCloneUploadServer
	envOwnerUID         = contract.EnvCloneOwnerUID
	envPreallocation    = contract.EnvClonePreallocation
	envServerCACert     = contract.EnvCloneServerCACert
	envClientCert       = contract.EnvCloneClientCert
	envClientKey        = contract.EnvCloneClientKey
	// sourceMountPoint is where a Filesystem source is mounted read-only.
	sourceMountPoint = contract.CloneSourceMountPoint
	// componentCloneSource is the clone source pod's component label.
	componentCloneSource = "clone-source"
	// labelExcludeFromBackup keeps temporary claims out of Velero backups.
	labelExcludeFromBackup = "velero.io/exclude-from-backup"
)

// volumeModeEnv is VOLUME_MODE for a claim: "block" or "filesystem".
func volumeModeEnv(pvc *corev1.PersistentVolumeClaim) string {
	return strings.ToLower(string(volumeMode(pvc.Spec.VolumeMode)))
}

// PodUsingClaim names a pod of pods that mounts claim writable and stops a
// clone of it, as "<ns>/<name>", or "" when none does. Finished pods,
// read-only mounts and clone source pods do not count.
func PodUsingClaim(pods []corev1.Pod, claim string) string {
	for _, pod := range pods {
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.DeletionTimestamp != nil {
			continue
		}
		if pod.Labels[cdiv1.LabelComponent] == componentCloneSource {
			continue
		}
		for _, v := range pod.Spec.Volumes {
			if pvc := v.PersistentVolumeClaim; pvc != nil && pvc.ClaimName == claim && !pvc.ReadOnly && !mountedReadOnly(pod, v.Name) {
				return fmt.Sprintf("%s/%s", pod.Namespace, pod.Name)
			}
		}
	}
	return ""
}

// mountedReadOnly reports whether every container mounts volume read-only.
func mountedReadOnly(pod corev1.Pod, volume string) bool {
	mounted := false
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for _, m := range c.VolumeMounts {
			if m.Name == volume {
				mounted = true
				if !m.ReadOnly {
					return false
				}
			}
		}
		for _, d := range c.VolumeDevices {
			if d.Name == volume {
				return false // a device is always writable
			}
		}
	}
	return mounted
}
