package nodeagent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podVolume is a pod volume ready on the host.
type podVolume struct {
	path     string
	block    bool
	readOnly bool
	// csiVolumeID is set when the agent published it through the CSI
	// driver at path and must unpublish it.
	csiVolumeID string
	// hostPath is set for a host directory (a hostPath PV), which fsGroup
	// leaves alone.
	hostPath bool
}

// apiGetter reads ConfigMaps and Secrets from the API (the Node authorizer
// lets the node read those its pods refer to).
type apiGetter struct {
	ctx context.Context
	a   *Agent
}

func (g apiGetter) configMap(ns, name string) (*corev1.ConfigMap, error) {
	return g.a.client.CoreV1().ConfigMaps(ns).Get(g.ctx, name, metav1.GetOptions{})
}

func (g apiGetter) secret(ns, name string) (*corev1.Secret, error) {
	return g.a.client.CoreV1().Secrets(ns).Get(g.ctx, name, metav1.GetOptions{})
}

// setupVolumes makes every volume of the pod ready under the pod's dir. On
// error it undoes what it did, so the caller can simply retry.
func (w *podWorker) setupVolumes(ctx context.Context, pod *corev1.Pod) (vols map[string]podVolume, err error) {
	vols = map[string]podVolume{}
	defer func() {
		if err != nil {
			w.teardownVolumes(vols)
		}
	}()
	get := apiGetter{ctx: ctx, a: w.a}
	for _, v := range pod.Spec.Volumes {
		dir := filepath.Join(w.dir, "volumes", v.Name)
		var pv podVolume
		var err error
		switch {
		case v.PersistentVolumeClaim != nil:
			pv, err = w.publishClaim(ctx, pod, v.PersistentVolumeClaim, dir)
		case v.EmptyDir != nil:
			pv, err = podVolume{path: dir}, makeWritableDir(dir)
		case v.HostPath != nil:
			pv, err = hostPathVolume(v.HostPath.Path, v.HostPath.Type)
		case v.Secret != nil:
			pv, err = podVolume{path: dir, readOnly: true}, writeSecretVolume(pod, v.Secret, dir, get)
		case v.ConfigMap != nil:
			pv, err = podVolume{path: dir, readOnly: true}, writeConfigMapVolume(pod, v.ConfigMap, dir, get)
		case v.DownwardAPI != nil:
			pv, err = podVolume{path: dir, readOnly: true}, writeDownwardVolume(pod, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode, dir)
		case v.Projected != nil:
			pv, err = podVolume{path: dir, readOnly: true}, w.writeProjectedVolume(ctx, pod, v.Projected, dir, get)
		default:
			err = fmt.Errorf("volume %s: this volume type is not supported by the kubefill node agent", v.Name)
		}
		if err != nil {
			return vols, fmt.Errorf("MountVolume.SetUp failed for volume %q: %w", v.Name, err)
		}
		vols[v.Name] = pv
		// fsGroup applies to the volumes the kubelet manages and to our CSI
		// driver's filesystem volumes (its CSIDriver has fsGroupPolicy File);
		// not to hostPath volumes or block devices.
		if psc := pod.Spec.SecurityContext; psc != nil && psc.FSGroup != nil && !pv.block && v.HostPath == nil && !pv.hostPath {
			if err := applyFSGroup(pv.path, *psc.FSGroup, pv.readOnly); err != nil {
				return vols, fmt.Errorf("MountVolume.SetUp failed for volume %q: fsGroup: %w", v.Name, err)
			}
		}
	}
	return vols, nil
}

func makeWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	return os.Chmod(dir, 0o777)
}

func hostPathVolume(path string, t *corev1.HostPathType) (podVolume, error) {
	typ := corev1.HostPathUnset
	if t != nil {
		typ = *t
	}
	st, err := os.Stat(path)
	switch typ {
	case corev1.HostPathDirectoryOrCreate:
		if err != nil {
			if err := os.MkdirAll(path, 0o755); err != nil {
				return podVolume{}, err
			}
		}
	case corev1.HostPathFileOrCreate:
		if err != nil {
			if err := os.WriteFile(path, nil, 0o644); err != nil {
				return podVolume{}, err
			}
		}
	case corev1.HostPathDirectory, corev1.HostPathFile, corev1.HostPathBlockDev:
		if err != nil {
			return podVolume{}, fmt.Errorf("hostPath %s: %w", path, err)
		}
	default:
		if err != nil && !os.IsNotExist(err) {
			return podVolume{}, err
		}
		if os.IsNotExist(err) {
			if err := os.MkdirAll(path, 0o755); err != nil {
				return podVolume{}, err
			}
		}
	}
	if st, err = os.Stat(path); err != nil {
		return podVolume{}, err
	}
	return podVolume{path: path, block: !st.IsDir() && typ == corev1.HostPathBlockDev}, nil
}

// publishClaim publishes a bound claim's CSI volume at dir (a directory for
// Filesystem volumes, a file for Block ones) through NodePublishVolume.
func (w *podWorker) publishClaim(ctx context.Context, pod *corev1.Pod, src *corev1.PersistentVolumeClaimVolumeSource, dir string) (podVolume, error) {
	pvc, err := w.a.client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, src.ClaimName, metav1.GetOptions{})
	if err != nil {
		return podVolume{}, fmt.Errorf("get PVC %s: %w", src.ClaimName, err)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		return podVolume{}, fmt.Errorf("PVC %s is not bound", src.ClaimName)
	}
	pv, err := w.a.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return podVolume{}, fmt.Errorf("get PV %s: %w", pvc.Spec.VolumeName, err)
	}
	block := pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock
	readOnly := src.ReadOnly
	switch {
	case pv.Spec.HostPath != nil:
		v, err := hostPathVolume(pv.Spec.HostPath.Path, pv.Spec.HostPath.Type)
		v.readOnly, v.hostPath = readOnly, true
		return v, err
	case pv.Spec.CSI != nil && pv.Spec.CSI.Driver == w.a.cfg.DriverName:
	default:
		return podVolume{}, fmt.Errorf("PV %s is neither a %s CSI volume nor a hostPath volume", pv.Name, w.a.cfg.DriverName)
	}
	cap := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csiAccessMode(pv.Spec.AccessModes)}}
	if block {
		cap.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		cap.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: pv.Spec.CSI.FSType}}
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return podVolume{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	_, err = w.a.csi.NodePublishVolume(cctx, &csi.NodePublishVolumeRequest{
		VolumeId:         pv.Spec.CSI.VolumeHandle,
		TargetPath:       dir,
		VolumeCapability: cap,
		Readonly:         readOnly || pv.Spec.CSI.ReadOnly,
		VolumeContext:    pv.Spec.CSI.VolumeAttributes,
	})
	if err != nil {
		return podVolume{}, fmt.Errorf("NodePublishVolume %s: %w", pv.Spec.CSI.VolumeHandle, err)
	}
	return podVolume{path: dir, block: block, readOnly: readOnly, csiVolumeID: pv.Spec.CSI.VolumeHandle}, nil
}

func csiAccessMode(modes []corev1.PersistentVolumeAccessMode) csi.VolumeCapability_AccessMode_Mode {
	for _, m := range modes {
		switch m {
		case corev1.ReadWriteMany:
			return csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
		case corev1.ReadOnlyMany:
			return csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
		case corev1.ReadWriteOncePod:
			return csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		}
	}
	return csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
}

// teardownVolumes unpublishes the CSI volumes; the other volumes are files
// in the pod's dir.
func (w *podWorker) teardownVolumes(vols map[string]podVolume) {
	for name, v := range vols {
		if v.csiVolumeID == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := w.a.csi.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.csiVolumeID, TargetPath: v.path})
		cancel()
		if err != nil {
			w.logf("unpublish volume %s: %v", name, err)
			continue
		}
		delete(vols, name)
	}
}

// containerMounts lists a container's bind mounts: its volumeMounts and
// volumeDevices, and the pod's /etc/hosts, /etc/hostname and
// /etc/resolv.conf.
func (w *podWorker) containerMounts(pod *corev1.Pod, c *container, vols map[string]podVolume) ([]InitMount, error) {
	etc, err := w.writeEtcFiles(pod)
	if err != nil {
		return nil, err
	}
	mounts := etc
	for _, m := range c.spec.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			return nil, fmt.Errorf("volumeMount %s: no volume of that name", m.Name)
		}
		if v.block {
			return nil, fmt.Errorf("volumeMount %s: volume is a block volume; use volumeDevices", m.Name)
		}
		src := v.path
		if m.SubPath != "" {
			sub := filepath.Clean("/" + m.SubPath)
			src = filepath.Join(v.path, sub)
			if err := os.MkdirAll(src, 0o777); err != nil {
				return nil, fmt.Errorf("subPath %s: %w", m.SubPath, err)
			}
		}
		st, err := os.Stat(src)
		if err != nil {
			return nil, fmt.Errorf("volumeMount %s: %w", m.Name, err)
		}
		mounts = append(mounts, InitMount{Source: src, Target: m.MountPath, ReadOnly: m.ReadOnly || v.readOnly, File: !st.IsDir()})
	}
	for _, d := range c.spec.VolumeDevices {
		v, ok := vols[d.Name]
		if !ok {
			return nil, fmt.Errorf("volumeDevice %s: no volume of that name", d.Name)
		}
		if !v.block {
			return nil, fmt.Errorf("volumeDevice %s: volume is not a block volume; use volumeMounts", d.Name)
		}
		mounts = append(mounts, InitMount{Source: v.path, Target: d.DevicePath, File: true, ReadOnly: v.readOnly})
	}
	return mounts, nil
}

func (w *podWorker) writeEtcFiles(pod *corev1.Pod) ([]InitMount, error) {
	dir := filepath.Join(w.dir, "etc")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	hostname := pod.Name
	if pod.Spec.Hostname != "" {
		hostname = pod.Spec.Hostname
	}
	w.mu.Lock()
	addr := w.addr.String()
	w.mu.Unlock()
	files := map[string]string{
		"hosts":       fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", addr, hostname),
		"hostname":    hostname + "\n",
		"resolv.conf": fmt.Sprintf("search %s.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n", pod.Namespace),
	}
	var mounts []InitMount
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return nil, err
		}
		mounts = append(mounts, InitMount{Source: p, Target: "/etc/" + name, File: true, ReadOnly: true})
	}
	return mounts, nil
}

// writeFiles writes a volume's files: path -> content, with mode.
func writeFiles(dir string, files map[string][]byte, mode int32) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for rel, data := range files {
		clean := filepath.Clean("/" + rel)
		if strings.Contains(rel, "..") {
			return fmt.Errorf("volume item path %q may not contain '..'", rel)
		}
		p := filepath.Join(dir, clean)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, os.FileMode(mode)); err != nil {
			return err
		}
		if err := os.Chmod(p, os.FileMode(mode)); err != nil {
			return err
		}
	}
	return nil
}

func modeOr(m *int32, def int32) int32 {
	if m != nil {
		return *m
	}
	return def
}

// selectItems picks keys for a volume: all keys, or the listed items.
func selectItems(data map[string][]byte, items []corev1.KeyToPath, optional bool, what string) (map[string][]byte, error) {
	out := map[string][]byte{}
	if len(items) == 0 {
		for k, v := range data {
			out[k] = v
		}
		return out, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf("%s has no key %q", what, it.Key)
		}
		out[it.Path] = v
	}
	return out, nil
}

func secretFiles(pod *corev1.Pod, name string, items []corev1.KeyToPath, optional bool, get objectGetter) (map[string][]byte, error) {
	s, err := get.secret(pod.Namespace, name)
	if err != nil {
		if apierrors.IsNotFound(err) && optional {
			return map[string][]byte{}, nil
		}
		return nil, fmt.Errorf("secret %s: %w", name, err)
	}
	return selectItems(s.Data, items, optional, "secret "+name)
}

func configMapFiles(pod *corev1.Pod, name string, items []corev1.KeyToPath, optional bool, get objectGetter) (map[string][]byte, error) {
	cm, err := get.configMap(pod.Namespace, name)
	if err != nil {
		if apierrors.IsNotFound(err) && optional {
			return map[string][]byte{}, nil
		}
		return nil, fmt.Errorf("configmap %s: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return selectItems(data, items, optional, "configmap "+name)
}

func writeSecretVolume(pod *corev1.Pod, s *corev1.SecretVolumeSource, dir string, get objectGetter) error {
	files, err := secretFiles(pod, s.SecretName, s.Items, s.Optional != nil && *s.Optional, get)
	if err != nil {
		return err
	}
	return writeFiles(dir, files, modeOr(s.DefaultMode, 0o644))
}

func writeConfigMapVolume(pod *corev1.Pod, c *corev1.ConfigMapVolumeSource, dir string, get objectGetter) error {
	files, err := configMapFiles(pod, c.Name, c.Items, c.Optional != nil && *c.Optional, get)
	if err != nil {
		return err
	}
	return writeFiles(dir, files, modeOr(c.DefaultMode, 0o644))
}

func downwardFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile) (map[string][]byte, error) {
	files := map[string][]byte{}
	for _, it := range items {
		switch {
		case it.FieldRef != nil:
			v, err := fieldValue(pod, it.FieldRef.FieldPath)
			if err != nil {
				return nil, err
			}
			files[it.Path] = []byte(v)
		case it.ResourceFieldRef != nil:
			var ctr *corev1.Container
			for i := range pod.Spec.Containers {
				if pod.Spec.Containers[i].Name == it.ResourceFieldRef.ContainerName || it.ResourceFieldRef.ContainerName == "" {
					ctr = &pod.Spec.Containers[i]
					break
				}
			}
			if ctr == nil {
				return nil, fmt.Errorf("downward API: no container %q", it.ResourceFieldRef.ContainerName)
			}
			v, err := resourceValue(ctr, it.ResourceFieldRef)
			if err != nil {
				return nil, err
			}
			files[it.Path] = []byte(v)
		}
	}
	return files, nil
}

func writeDownwardVolume(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile, mode *int32, dir string) error {
	files, err := downwardFiles(pod, items)
	if err != nil {
		return err
	}
	return writeFiles(dir, files, modeOr(mode, 0o644))
}

// writeProjectedVolume writes a projected volume: service-account tokens
// (from the real TokenRequest API, bound to the pod), configmaps, secrets and
// downward API files.
func (w *podWorker) writeProjectedVolume(ctx context.Context, pod *corev1.Pod, p *corev1.ProjectedVolumeSource, dir string, get objectGetter) error {
	files := map[string][]byte{}
	merge := func(m map[string][]byte) {
		for k, v := range m {
			files[k] = v
		}
	}
	for _, src := range p.Sources {
		switch {
		case src.ServiceAccountToken != nil:
			t := src.ServiceAccountToken
			sa := pod.Spec.ServiceAccountName
			if sa == "" {
				sa = "default"
			}
			exp := int64(3600)
			if t.ExpirationSeconds != nil {
				exp = *t.ExpirationSeconds
			}
			var aud []string
			if t.Audience != "" {
				aud = []string{t.Audience}
			}
			tr, err := w.a.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
				Spec: authenticationv1.TokenRequestSpec{
					Audiences:         aud,
					ExpirationSeconds: &exp,
					BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("token for service account %s: %w", sa, err)
			}
			files[t.Path] = []byte(tr.Status.Token)
		case src.ConfigMap != nil:
			m, err := configMapFiles(pod, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional != nil && *src.ConfigMap.Optional, get)
			if err != nil {
				return err
			}
			merge(m)
		case src.Secret != nil:
			m, err := secretFiles(pod, src.Secret.Name, src.Secret.Items, src.Secret.Optional != nil && *src.Secret.Optional, get)
			if err != nil {
				return err
			}
			merge(m)
		case src.DownwardAPI != nil:
			m, err := downwardFiles(pod, src.DownwardAPI.Items)
			if err != nil {
				return err
			}
			merge(m)
		default:
			return fmt.Errorf("unsupported projected volume source")
		}
	}
	return writeFiles(dir, files, modeOr(p.DefaultMode, 0o644))
}
