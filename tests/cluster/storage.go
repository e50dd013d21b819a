package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// The snapshot CRDs come from the snapshotter release the CSI sidecars are
// built from (SNAPSHOTTER_VERSION in hack/sidecars.sh), not from the
// snapshot client Kubefill is built with (client/v6 in go.mod): the
// snapshot-controller and csi-snapshotter the cluster runs expect their
// own release's CRDs. Keep the version in step with hack/sidecars.sh.
const (
	snapshotCRDModule  = "github.com/kubernetes-csi/external-snapshotter/client/v8"
	snapshotCRDVersion = "v8.7.0"
)

var (
	crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	// VolumeSnapshotGVR and friends name the snapshot API the cluster installs.
	VolumeSnapshotGVR        = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	VolumeSnapshotClassGVR   = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotclasses"}
	VolumeSnapshotContentGVR = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
)

// CSISocket is the path of the CSI driver's socket.
func (c *Cluster) CSISocket() string { return filepath.Join(c.Dir, "csi", "csi.sock") }

// CSIDataDir is where the CSI driver keeps volumes and snapshots.
func (c *Cluster) CSIDataDir() string { return filepath.Join(c.Dir, "csi", "data") }

func (c *Cluster) startStorage(ctx context.Context) error {
	logf := c.opts.Logf
	t0 := time.Now()
	sidecars, err := scriptDir(c.repo, "sidecars.sh", "KUBEFILL_SIDECARS")
	if err != nil {
		return err
	}
	logf("cluster: CSI sidecars in %s", sidecars)
	args := []string{"csi-driver", "--name=" + DriverName, "--endpoint=" + c.CSISocket(), "--data-dir=" + c.CSIDataDir()}
	if c.opts.Node {
		// The sidecars' half; the node half runs in a pod (startCSINodePlugin).
		args = append(args, "--mode=controller")
	} else {
		args = append(args, "--node-id="+c.NodeName)
	}
	driver, err := c.run("csi-driver", nil, c.opts.HelperBinary, args...)
	if err != nil {
		return err
	}
	if err := waitFile(ctx, driver, c.CSISocket()); err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	if err := c.installStorageObjects(ctx, dyn); err != nil {
		return err
	}
	kc, err := c.writeKubeconfig("csi-sidecars", "kubefill-csi-sidecars", "system:masters")
	if err != nil {
		return err
	}
	csiAddr := "--csi-address=" + c.CSISocket()
	if _, err := c.run("csi-provisioner", nil, filepath.Join(sidecars, "csi-provisioner"),
		csiAddr, "--kubeconfig="+kc, "--leader-election=false", "--timeout=60s",
		"--extra-create-metadata", "--retry-interval-start=500ms", "--retry-interval-max=5s", "--v=2",
	); err != nil {
		return err
	}
	// Volume expansion: the external-resizer's part, for claims whose
	// request grows (a clone larger than its source, PrepClaim).
	if _, err := c.run("csi-resizer", nil, c.opts.HelperBinary, "csi-resizer",
		"--kubeconfig="+kc, "--driver="+DriverName, "--endpoint="+c.CSISocket(),
	); err != nil {
		return err
	}
	// A short resync: a snapshot deleted while the driver was still taking
	// it is otherwise left with its content until the 15-minute resync
	// (the sidecars miss that update; seen with clones deleted mid-snapshot).
	if _, err := c.run("csi-snapshotter", nil, filepath.Join(sidecars, "csi-snapshotter"),
		csiAddr, "--kubeconfig="+kc, "--leader-election=false", "--timeout=60s",
		"--retry-interval-start=500ms", "--retry-interval-max=5s", "--resync-period=15s", "--v=2",
	); err != nil {
		return err
	}
	if _, err := c.run("snapshot-controller", nil, filepath.Join(sidecars, "snapshot-controller"),
		"--kubeconfig="+kc, "--leader-election=false",
		"--retry-interval-start=500ms", "--retry-interval-max=5s", "--resync-period=15s", "--v=2",
	); err != nil {
		return err
	}
	logf("cluster: storage ready (%s)", time.Since(t0).Round(time.Millisecond))
	return nil
}

// snapshotCRDDir finds config/crd of the sidecars' snapshot client module,
// downloading the module when the cache lacks it.
func (c *Cluster) snapshotCRDDir() (string, error) {
	out, err := goCmd(c.repo, "mod", "download", "-json", snapshotCRDModule+"@"+snapshotCRDVersion)
	if err != nil {
		return "", fmt.Errorf("download %s: %w", snapshotCRDModule, err)
	}
	var dir string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, `"Dir": "`) {
			dir = strings.TrimSuffix(strings.TrimPrefix(line, `"Dir": "`), `",`)
		}
	}
	crd := filepath.Join(dir, "config", "crd")
	if _, err := os.Stat(crd); err != nil {
		return "", fmt.Errorf("snapshot CRDs not found in %s: %w", crd, err)
	}
	return crd, nil
}

func goCmd(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// snapshotCRDFiles are the VolumeSnapshot, VolumeSnapshotContent and
// VolumeSnapshotClass CRDs (and the group-snapshot ones) that the snapshot
// client module ships in dir.
func snapshotCRDFiles(dir string) []string {
	var files []string
	// The group-snapshot CRDs are optional, but without them the
	// snapshot-controller spends its first 30 s waiting for them.
	for _, f := range []string{
		"snapshot.storage.k8s.io_volumesnapshotclasses.yaml",
		"snapshot.storage.k8s.io_volumesnapshotcontents.yaml",
		"snapshot.storage.k8s.io_volumesnapshots.yaml",
		"groupsnapshot.storage.k8s.io_volumegroupsnapshotclasses.yaml",
		"groupsnapshot.storage.k8s.io_volumegroupsnapshotcontents.yaml",
		"groupsnapshot.storage.k8s.io_volumegroupsnapshots.yaml",
	} {
		files = append(files, filepath.Join(dir, f))
	}
	return files
}

// applyCRDs creates the CRDs in files and waits until they are established.
func applyCRDs(ctx context.Context, dyn dynamic.Interface, files []string) error {
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("read CRD: %w", err)
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			return fmt.Errorf("parse %s: %w", f, err)
		}
		if _, err := dyn.Resource(crdGVR).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s: %w", obj.GetName(), err)
		}
		names = append(names, obj.GetName())
	}
	ctx, cancel := context.WithTimeout(ctx, componentStartupTimeout)
	defer cancel()
	for _, name := range names {
		for {
			obj, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err == nil && crdEstablished(obj) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not established: %v", name, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

func crdEstablished(obj *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// installStorageObjects creates the CSIDriver, the two StorageClasses and the
// VolumeSnapshotClass.
func (c *Cluster) installStorageObjects(ctx context.Context, dyn dynamic.Interface) error {
	no, yes := false, true
	fsPolicy := storagev1.FileFSGroupPolicy
	drv := &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: DriverName},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired:       &no,
			PodInfoOnMount:       &no,
			StorageCapacity:      &no,
			RequiresRepublish:    &no,
			FSGroupPolicy:        &fsPolicy,
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
		},
	}
	if _, err := c.Client.StorageV1().CSIDrivers().Create(ctx, drv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create CSIDriver: %w", err)
	}
	del := corev1.PersistentVolumeReclaimDelete
	immediate, wffc := storagev1.VolumeBindingImmediate, storagev1.VolumeBindingWaitForFirstConsumer
	for _, sc := range []*storagev1.StorageClass{
		{
			ObjectMeta: metav1.ObjectMeta{Name: StorageClassImmediate, Annotations: map[string]string{
				"storageclass.kubernetes.io/is-default-class": "true"}},
			Provisioner: DriverName, ReclaimPolicy: &del, VolumeBindingMode: &immediate, AllowVolumeExpansion: &yes,
		},
		{
			ObjectMeta:  metav1.ObjectMeta{Name: StorageClassWFFC},
			Provisioner: DriverName, ReclaimPolicy: &del, VolumeBindingMode: &wffc, AllowVolumeExpansion: &yes,
		},
	} {
		if _, err := c.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create StorageClass %s: %w", sc.Name, err)
		}
	}
	vsc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1",
		"kind":       "VolumeSnapshotClass",
		"metadata": map[string]any{
			"name":        VolumeSnapshotClass,
			"annotations": map[string]any{"snapshot.storage.kubernetes.io/is-default-class": "true"},
		},
		"driver":         DriverName,
		"deletionPolicy": "Delete",
	}}
	if _, err := dyn.Resource(VolumeSnapshotClassGVR).Create(ctx, vsc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create VolumeSnapshotClass: %w", err)
	}
	return nil
}

func waitFile(ctx context.Context, rec procRecord, path string) error {
	return waitReady(ctx, rec, componentStartupTimeout, 20*time.Millisecond, rec.Name+" never created "+path, func(context.Context) (bool, string) {
		_, err := os.Stat(path)
		return err == nil, ""
	})
}
