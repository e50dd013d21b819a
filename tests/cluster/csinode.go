package cluster

import (
	"path/filepath"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// CSINodePluginParams describes the hostpath driver's node plugin on a real
// node.
type CSINodePluginParams struct {
	// Image holds the kubefill-dev binary (kubefill-test/dev:e2e); it must
	// already be in containerd: the pod never pulls.
	Image string
	// Binary is the multi-call helper's name or path in the image.
	// Default "kubefill-dev".
	Binary string
	// DriverName is the CSI driver name (DriverName).
	DriverName string
	// NodeName is what NodeGetInfo reports; "" takes the pod's spec.nodeName.
	NodeName string
	// KubeletRoot is kubelet's --root-dir on the host.
	KubeletRoot string
	// DataDir is the driver's data directory on the host, shared with the
	// controller-mode process that the sidecars call.
	DataDir string
	// Namespace defaults to kube-system.
	Namespace string
}

// CSINodePluginName names the node plugin's DaemonSet and labels its pods.
const CSINodePluginName = "kubefill-csi-hostpath-node"

// CSINodeSocket is the CSI socket the node plugin serves and kubelet dials.
func CSINodeSocket(kubeletRoot, driver string) string {
	return filepath.Join(kubeletRoot, "plugins", driver, "csi.sock")
}

// CSIRegistrationSocket is where the node plugin registers with kubelet,
// which watches <root>/plugins_registry for sockets.
func CSIRegistrationSocket(kubeletRoot, driver string) string {
	return filepath.Join(kubeletRoot, "plugins_registry", driver+"-reg.sock")
}

// CSINodePluginDaemonSet is the hostpath driver's node side (csi-driver
// --mode=node) as a privileged DaemonSet that registers itself with kubelet
// (there is no node-driver-registrar).
//
// Every host path is mounted at the same path inside, because kubelet hands
// the plugin host paths (targets under the kubelet root) and the volume
// files it attaches are named by host path in /sys/block/loop*/loop. Only
// the kubelet root propagates mounts (Bidirectional), so that the bind
// mounts the plugin makes at kubelet's targets reach the host; kubelet makes
// that directory a shared mount itself. The data dir and /dev need no
// propagation (files, and devtmpfs shows new loop nodes through any bind),
// and Bidirectional or HostToContainer would make containerd refuse them
// unless they sat on a shared mount, which / on the test host is not.
func CSINodePluginDaemonSet(p CSINodePluginParams) *appsv1.DaemonSet {
	ns := p.Namespace
	if ns == "" {
		ns = "kube-system"
	}
	bin := p.Binary
	if bin == "" {
		bin = "kubefill-dev"
	}
	nodeID := p.NodeName
	var env []corev1.EnvVar
	if nodeID == "" {
		env = []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "spec.nodeName"}}}}
		nodeID = "$(NODE_NAME)"
	}
	labels := map[string]string{"app.kubernetes.io/name": CSINodePluginName}
	bidirectional := corev1.MountPropagationBidirectional
	hostDir := func(name, path string, typ corev1.HostPathType) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &typ}}}
	}
	return &appsv1.DaemonSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: metav1.ObjectMeta{Name: CSINodePluginName, Namespace: ns, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					HostNetwork:                  true,
					PriorityClassName:            "system-node-critical",
					Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					AutomountServiceAccountToken: ptr.To(false),
					EnableServiceLinks:           ptr.To(false),
					// On SIGTERM the driver removes its registration socket,
					// which is how kubelet learns it is gone; that is quick.
					TerminationGracePeriodSeconds: ptr.To[int64](10),
					Containers: []corev1.Container{{
						Name:            "hostpath",
						Image:           p.Image,
						ImagePullPolicy: corev1.PullNever,
						Command: []string{bin, "csi-driver",
							"--mode=node",
							"--name=" + p.DriverName,
							"--endpoint=" + CSINodeSocket(p.KubeletRoot, p.DriverName),
							"--registration-socket=" + CSIRegistrationSocket(p.KubeletRoot, p.DriverName),
							"--data-dir=" + p.DataDir,
							"--node-id=" + nodeID,
						},
						Env: env,
						// Mounts and loop devices need root and all
						// capabilities; the image's default user is not root.
						SecurityContext: &corev1.SecurityContext{
							Privileged:   ptr.To(true),
							RunAsUser:    ptr.To[int64](0),
							RunAsGroup:   ptr.To[int64](0),
							RunAsNonRoot: ptr.To(false),
						},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "kubelet-root", MountPath: p.KubeletRoot, MountPropagation: &bidirectional},
							{Name: "data", MountPath: p.DataDir},
							// The host's /dev, not the runtime's copy made at
							// container start: loop devices added later must
							// appear.
							{Name: "dev", MountPath: "/dev"},
						},
					}},
					Volumes: []corev1.Volume{
						hostDir("kubelet-root", p.KubeletRoot, corev1.HostPathDirectory),
						hostDir("data", p.DataDir, corev1.HostPathDirectoryOrCreate),
						hostDir("dev", "/dev", corev1.HostPathDirectory),
					},
				},
			},
		},
	}
}
