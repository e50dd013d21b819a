package hostpath

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func dial(t *testing.T, endpoint string) (csi.ControllerClient, csi.NodeClient) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return csi.NewControllerClient(conn), csi.NewNodeClient(conn)
}

func capOf(block bool) *csi.VolumeCapability {
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if block {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}
	}
	return c
}

// publish bind-mounts a volume at a fresh target and unpublishes it at the
// end of the test.
func publish(t *testing.T, node csi.NodeClient, id, target string, block bool) {
	t.Helper()
	ctx := context.Background()
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: capOf(block)}); err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
	t.Cleanup(func() {
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Errorf("unpublish %s: %v", id, err)
		}
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Errorf("target %s still exists after unpublish", target)
		}
	})
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return buf
}

// TestBlockVolumes writes through a published block volume and checks that a
// snapshot restore and a clone carry the bytes, and that expansion grows it.
func TestBlockVolumes(t *testing.T) {
	endpoint, _, base := startDriver(t)
	ctrl, node := dial(t, endpoint)
	ctx := context.Background()
	const size = 4 << 20

	src, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "src", CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{capOf(true)}})
	if err != nil {
		t.Fatal(err)
	}
	srcID := src.GetVolume().GetVolumeId()
	target := filepath.Join(base, "pods", "a", "dev")
	publish(t, node, srcID, target, true)

	payload := make([]byte, 64<<10)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	const off = 1 << 20
	f, err := os.OpenFile(target, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(payload, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(target); err != nil || st.Size() != size {
		t.Fatalf("published block target size = %v, %v; want %d", st.Size(), err, size)
	}

	snap, err := ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: srcID})
	if err != nil {
		t.Fatal(err)
	}
	if !snap.GetSnapshot().GetReadyToUse() || snap.GetSnapshot().GetSizeBytes() != size {
		t.Fatalf("snapshot = %+v, want ready with %d bytes", snap.GetSnapshot(), size)
	}

	// A restore may be larger than its source; the bytes must match and the
	// extra space must read as zeros.
	restored, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "restored", CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * size},
		VolumeCapabilities: []*csi.VolumeCapability{capOf(true)},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}}})
	if err != nil {
		t.Fatal(err)
	}
	rTarget := filepath.Join(base, "pods", "b", "dev")
	publish(t, node, restored.GetVolume().GetVolumeId(), rTarget, true)
	if got := readAt(t, rTarget, off, len(payload)); !bytes.Equal(got, payload) {
		t.Fatal("restored volume does not hold the snapshot's bytes")
	}
	if got := readAt(t, rTarget, size+4096, 4096); !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatal("restored volume's extra space is not zero")
	}

	clone, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "clone", CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{capOf(true)},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: srcID}}}})
	if err != nil {
		t.Fatal(err)
	}
	cTarget := filepath.Join(base, "pods", "c", "dev")
	publish(t, node, clone.GetVolume().GetVolumeId(), cTarget, true)
	if got := readAt(t, cTarget, off, len(payload)); !bytes.Equal(got, payload) {
		t.Fatal("cloned volume does not hold the source's bytes")
	}

	// A filesystem request for a block snapshot is refused.
	_, err = ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "wrong-mode", VolumeCapabilities: []*csi.VolumeCapability{capOf(false)},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("filesystem volume from block snapshot: err = %v, want InvalidArgument", err)
	}

	exp, err := ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: srcID, CapacityRange: &csi.CapacityRange{RequiredBytes: 3 * size}})
	if err != nil {
		t.Fatal(err)
	}
	if exp.GetCapacityBytes() != 3*size {
		t.Fatalf("expanded capacity = %d, want %d", exp.GetCapacityBytes(), 3*size)
	}
	if st, err := os.Stat(target); err != nil || st.Size() != 3*size {
		t.Fatalf("expanded block size = %v, %v; want %d", st.Size(), err, 3*size)
	}
	if got := readAt(t, target, off, len(payload)); !bytes.Equal(got, payload) {
		t.Fatal("expansion changed the volume's bytes")
	}
}

// TestFilesystemClone checks that a restore and a clone of a filesystem
// volume carry its files.
func TestFilesystemClone(t *testing.T) {
	endpoint, _, base := startDriver(t)
	ctrl, node := dial(t, endpoint)
	ctx := context.Background()
	src, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "fs-src", VolumeCapabilities: []*csi.VolumeCapability{capOf(false)}})
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(base, "pods", "a", "mnt")
	publish(t, node, src.GetVolume().GetVolumeId(), target, false)
	if err := os.MkdirAll(filepath.Join(target, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "sub", "disk.img"), []byte("kubefill bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	snap, err := ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "fs-snap", SourceVolumeId: src.GetVolume().GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		src  *csi.VolumeContentSource
	}{
		{"fs-restore", &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}}},
		{"fs-clone", &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolume().GetVolumeId()}}}},
	} {
		v, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: tc.name, VolumeCapabilities: []*csi.VolumeCapability{capOf(false)}, VolumeContentSource: tc.src})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		tgt := filepath.Join(base, "pods", tc.name, "mnt")
		publish(t, node, v.GetVolume().GetVolumeId(), tgt, false)
		got, err := os.ReadFile(filepath.Join(tgt, "sub", "disk.img"))
		if err != nil || string(got) != "kubefill bytes" {
			t.Fatalf("%s: read file = %q, %v", tc.name, got, err)
		}
	}
	// The source cannot be deleted while it is published.
	_, err = ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: src.GetVolume().GetVolumeId()})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("delete published volume: err = %v, want FailedPrecondition", err)
	}
}
