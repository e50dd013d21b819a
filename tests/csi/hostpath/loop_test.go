package hostpath

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubefill/kubefill/tests/kit"
)

// splitDrivers serves a controller-mode and a node-mode driver on one data
// dir, as the host and the node plugin pod run them, and cleans up every
// mount and loop device under base, also when the test fails.
func splitDrivers(t *testing.T) (ctrl csi.ControllerClient, node csi.NodeClient, base, dataDir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("publishing mounts and attaches loop devices: needs root")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices here: %v", err)
	}
	base = t.TempDir()
	t.Cleanup(func() { unmountBelow(t, base) })
	t.Cleanup(func() { detachLoopsBelow(t, base) })
	dataDir = filepath.Join(base, "data")
	c := serveDriver(t, base, Config{Mode: ModeController, DataDir: dataDir})
	n := serveDriver(t, base, Config{Mode: ModeNode, DataDir: dataDir, NodeID: "node-1"})
	ctrl = csi.NewControllerClient(dialConn(t, c.cfg.Endpoint))
	node = csi.NewNodeClient(dialConn(t, n.cfg.Endpoint))
	return ctrl, node, base, dataDir
}

// detachLoopsBelow detaches the loop devices bound to files under dir (only
// this test's) and fails the test if it had to.
func detachLoopsBelow(t *testing.T, dir string) {
	devs, _ := filepath.Glob("/sys/block/loop*")
	for _, d := range devs {
		dev := "/dev/" + filepath.Base(d)
		b, err := loopBackingFile(dev)
		if err != nil || !strings.HasPrefix(b, dir+"/") {
			continue
		}
		t.Errorf("left attached: %s -> %s", dev, b)
		if err := detachLoop(dev); err != nil {
			t.Errorf("%v", err)
		}
	}
}

func noLoopsFor(t *testing.T, file string) {
	t.Helper()
	kit.Eventually(t, 5*time.Second, 20*time.Millisecond, "no loop device bound to "+file, func() (bool, string, error) {
		devs, err := loopsBackedBy(file)
		return len(devs) == 0, strings.Join(devs, " "), err
	})
}

func writeAt(t *testing.T, path string, off int64, data []byte, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBlockPublishLoopDevice publishes a Block volume the way kubelet needs
// it: a loop device node at the target file. Bytes written through it land
// in the backing file, a snapshot taken while it is attached carries what
// was written (even unflushed), an expansion reaches the device, and after
// unpublish no loop device is left on the file.
func TestBlockPublishLoopDevice(t *testing.T) {
	ctrl, node, base, dataDir := splitDrivers(t)
	ctx := context.Background()
	const size = 8 << 20
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "blk", CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{capOf(true)}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	file := filepath.Join(dataDir, "volumes", id+".img")

	// kubelet's publish path: a file in a directory it made.
	target := filepath.Join(base, "kubelet", "plugins", "kubernetes.io", "csi", "volumeDevices", "publish", "pv-blk", "pod-uid-1")
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	req := &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: capOf(true)}
	if _, err := node.NodePublishVolume(ctx, req); err != nil {
		t.Fatalf("publish: %v", err)
	}
	unpublished := false
	t.Cleanup(func() {
		if !unpublished {
			_, _ = node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		}
	})
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK || unix.Major(st.Rdev) != loopMajor {
		t.Fatalf("target mode %o rdev %d:%d, want a loop block device", st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	dev, err := loopDeviceAt(target)
	if err != nil || dev == "" {
		t.Fatalf("loop device at target: %q, %v", dev, err)
	}
	if b, err := loopBackingFile(dev); err != nil || b != file {
		t.Fatalf("%s is bound to %q (%v), want %s", dev, b, err, file)
	}
	if n, err := blockDeviceSize(target); err != nil || n != size {
		t.Fatalf("device size = %d, %v; want %d", n, err, size)
	}
	// A repeated publish (kubelet retries) is fine and adds no device.
	if _, err := node.NodePublishVolume(ctx, req); err != nil {
		t.Fatalf("second publish: %v", err)
	}
	if devs, _ := loopsBackedBy(file); len(devs) != 1 {
		t.Fatalf("loop devices on the file after two publishes: %v", devs)
	}
	stats, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
	if err != nil || stats.GetUsage()[0].GetTotal() != size {
		t.Fatalf("volume stats = %v, %v; want total %d", stats, err, size)
	}

	payload := randomBytes(t, 64<<10)
	const off = 1 << 20
	writeAt(t, target, off, payload, true)
	if got := readAt(t, file, off, len(payload)); !bytes.Equal(got, payload) {
		t.Fatal("the backing file does not hold the bytes written through the device")
	}

	// Written but not flushed, with the device still open as a pod would
	// hold it: the snapshot must still see it.
	later := randomBytes(t, 4096)
	f, err := os.OpenFile(target, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(later, 3<<20); err != nil {
		t.Fatal(err)
	}
	snap, err := ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "blk-snap", SourceVolumeId: id})
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	snapFile := filepath.Join(dataDir, "snapshots", snap.GetSnapshot().GetSnapshotId()+".img")
	if got := readAt(t, snapFile, off, len(payload)); !bytes.Equal(got, payload) {
		t.Fatal("the snapshot of an attached volume lacks its bytes")
	}
	if got := readAt(t, snapFile, 3<<20, len(later)); !bytes.Equal(got, later) {
		t.Fatal("the snapshot of an attached volume lacks bytes still cached in the device")
	}
	clone, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "blk-clone", CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities:  []*csi.VolumeCapability{capOf(true)},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}})
	if err != nil {
		t.Fatal(err)
	}
	cloneFile := filepath.Join(dataDir, "volumes", clone.GetVolume().GetVolumeId()+".img")
	if got := readAt(t, cloneFile, off, len(payload)); !bytes.Equal(got, payload) {
		t.Fatal("the clone of an attached volume lacks its bytes")
	}

	// A read-only publish elsewhere gets its own read-only device.
	roTarget := filepath.Join(base, "kubelet", "plugins", "kubernetes.io", "csi", "volumeDevices", "publish", "pv-blk", "pod-uid-2")
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: roTarget, VolumeCapability: capOf(true), Readonly: true}); err != nil {
		t.Fatalf("read-only publish: %v", err)
	}
	// The kernel may let it be opened for writing; the write must fail.
	if f, err := os.OpenFile(roTarget, os.O_WRONLY, 0); err == nil {
		_, werr := f.WriteAt(later, 0)
		if werr == nil {
			werr = f.Sync()
		}
		f.Close()
		if werr == nil {
			t.Error("wrote through a read-only published device")
		}
	}
	if got := readAt(t, roTarget, off, len(payload)); !bytes.Equal(got, payload) {
		t.Error("the read-only device does not read the volume")
	}

	// The controller side may not delete it while the node side has it.
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("delete a published volume: err = %v, want FailedPrecondition", err)
	}

	// Online expansion reaches the attached device.
	if _, err := ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * size}}); err != nil {
		t.Fatal(err)
	}
	if n, err := blockDeviceSize(target); err != nil || n != 2*size {
		t.Fatalf("device size after expansion = %d, %v; want %d", n, err, 2*size)
	}

	for _, tg := range []string{roTarget, target} {
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: tg}); err != nil {
			t.Fatalf("unpublish %s: %v", tg, err)
		}
		if _, err := os.Stat(tg); !os.IsNotExist(err) {
			t.Errorf("target %s still there after unpublish (%v)", tg, err)
		}
	}
	unpublished = true
	noLoopsFor(t, file)
	// Unpublishing again (kubelet retries) is fine.
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatalf("second unpublish: %v", err)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("delete after unpublish: %v", err)
	}
}

// TestBlockUnpublishFindsUnrecordedDevice: a device whose publication record
// was lost is still found (through the node at the target) and detached.
func TestBlockUnpublishFindsUnrecordedDevice(t *testing.T) {
	ctrl, node, base, dataDir := splitDrivers(t)
	ctx := context.Background()
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "blk2", CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{capOf(true)}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	target := filepath.Join(base, "publish", "uid")
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: capOf(true)}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dataDir, "published", id+".json")); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	noLoopsFor(t, filepath.Join(dataDir, "volumes", id+".img"))
}

// TestFilesystemPublishBindMount publishes a Filesystem volume as kubelet
// asks: a bind mount at a target directory the driver creates, read-only
// when asked, with mount flags, idempotent.
func TestFilesystemPublishBindMount(t *testing.T) {
	ctrl, node, base, dataDir := splitDrivers(t)
	ctx := context.Background()
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "fs", VolumeCapabilities: []*csi.VolumeCapability{capOf(false)}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	// kubelet makes .../<pv>/ (and writes vol_data.json there); "mount" is ours.
	target := filepath.Join(base, "kubelet", "pods", "uid", "volumes", "kubernetes.io~csi", "pv-fs", "mount")
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	req := &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: capOf(false)}
	if _, err := node.NodePublishVolume(ctx, req); err != nil {
		t.Fatalf("publish: %v", err)
	}
	t.Cleanup(func() {
		_, _ = node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	})
	if m, err := isMountPoint(target); err != nil || !m {
		t.Fatalf("target is a mount point: %v, %v", m, err)
	}
	if err := os.WriteFile(filepath.Join(target, "disk.img"), []byte("kubefill"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dataDir, "volumes", id, "disk.img")); err != nil || string(got) != "kubefill" {
		t.Fatalf("volume dir holds %q, %v", got, err)
	}
	if _, err := node.NodePublishVolume(ctx, req); err != nil {
		t.Fatalf("repeated publish: %v", err)
	}
	ro := &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: capOf(false), Readonly: true}
	if _, err := node.NodePublishVolume(ctx, ro); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("publish read-only over a read-write publish: err = %v, want AlreadyExists", err)
	}

	// Read-only, with flags from the PV's mountOptions.
	roTarget := filepath.Join(base, "kubelet", "pods", "uid2", "volumes", "kubernetes.io~csi", "pv-fs", "mount")
	flagged := capOf(false)
	flagged.GetMount().MountFlags = []string{"nosuid", "nodev,noexec"}
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: roTarget, VolumeCapability: flagged, Readonly: true}); err != nil {
		t.Fatalf("read-only publish: %v", err)
	}
	t.Cleanup(func() {
		_, _ = node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: roTarget})
	})
	if got, err := os.ReadFile(filepath.Join(roTarget, "disk.img")); err != nil || string(got) != "kubefill" {
		t.Fatalf("read-only target reads %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(roTarget, "other"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write to the read-only target: %v, want EROFS", err)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(roTarget, &sfs); err != nil {
		t.Fatal(err)
	}
	for flag, name := range map[int64]string{unix.ST_RDONLY: "ro", unix.ST_NOSUID: "nosuid", unix.ST_NODEV: "nodev", unix.ST_NOEXEC: "noexec"} {
		if sfs.Flags&flag == 0 {
			t.Errorf("read-only target lacks %s (flags %#x)", name, sfs.Flags)
		}
	}
	bad := capOf(false)
	bad.GetMount().MountFlags = []string{"discard"}
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(base, "bad"), VolumeCapability: bad}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("publish with a filesystem-only flag: err = %v, want InvalidArgument", err)
	}

	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("delete a published volume: err = %v, want FailedPrecondition", err)
	}
	for _, tg := range []string{roTarget, target} {
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: tg}); err != nil {
			t.Fatalf("unpublish %s: %v", tg, err)
		}
		if m, _ := isMountPoint(tg); m {
			t.Errorf("%s still mounted", tg)
		}
		if _, err := os.Stat(tg); !os.IsNotExist(err) {
			t.Errorf("target %s still there (%v)", tg, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "published", id+".json")); !os.IsNotExist(err) {
		t.Errorf("publication records left after the last unpublish (%v)", err)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("delete after unpublish: %v", err)
	}
}
