package hostpath

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Node service. kubelet calls it as the CSI node plugin (ModeNode, in a
// privileged pod that sees the host's kubelet root, data dir and /dev at
// their host paths); the node agent calls it in ModeAll on the host.
//
// There is no NodeStageVolume: a bind mount needs no per-node setup, and
// without STAGE_UNSTAGE_VOLUME kubelet publishes straight to the pod's
// target (Filesystem: pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount, a
// directory; Block: plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>,
// a file that must become the device node).

func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{
		{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_GET_VOLUME_STATS}}},
	}}, nil
}

func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: d.cfg.NodeID}, nil
}

// mountFlags maps the mount flags a volume capability may carry (a PV's
// spec.mountOptions) to bind-mount flags. Filesystem options other than
// these mean nothing to a bind mount, so they are refused rather than
// silently dropped.
var mountFlags = map[string]uintptr{
	"defaults":    0,
	"rw":          0,
	"ro":          unix.MS_RDONLY,
	"nosuid":      unix.MS_NOSUID,
	"nodev":       unix.MS_NODEV,
	"noexec":      unix.MS_NOEXEC,
	"noatime":     unix.MS_NOATIME,
	"nodiratime":  unix.MS_NODIRATIME,
	"relatime":    unix.MS_RELATIME,
	"strictatime": unix.MS_STRICTATIME,
}

func parseMountFlags(flags []string) (uintptr, error) {
	var out uintptr
	for _, f := range flags {
		// kubelet passes each option as given; "a,b" is one option list.
		for _, o := range strings.Split(f, ",") {
			o = strings.TrimSpace(o)
			if o == "" {
				continue
			}
			v, ok := mountFlags[o]
			if !ok {
				return 0, status.Errorf(codes.InvalidArgument, "mount flag %q is not supported by a bind mount", o)
			}
			out |= v
		}
	}
	return out, nil
}

func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	if req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	if req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume capability is required")
	}
	block, err := accessType([]*csi.VolumeCapability{req.GetVolumeCapability()})
	if err != nil {
		return nil, err
	}
	flags, err := parseMountFlags(req.GetVolumeCapability().GetMount().GetMountFlags())
	if err != nil {
		return nil, err
	}
	readOnly := req.GetReadonly() || flags&unix.MS_RDONLY != 0
	d.mu.Lock()
	defer d.mu.Unlock()
	v, err := d.store.getVolume(req.GetVolumeId())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read volume: %v", err)
	}
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", req.GetVolumeId())
	}
	if v.Block != block {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s is a %s volume, not %s", v.ID, kind(v.Block), kind(block))
	}
	pubs, err := d.store.publications(v.ID)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read publications of %s: %v", v.ID, err)
	}
	target := req.GetTargetPath()
	mounted, err := isMountPoint(target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "check target: %v", err)
	}
	if mounted {
		if p, ok := pubs[target]; ok && p.ReadOnly == readOnly {
			if p.Device != "" {
				// It may have grown since (expansion while unpublished
				// is refreshed by the controller only when it can).
				if err := refreshLoopCapacity(p.Device); err != nil {
					d.cfg.Logf("%v", err)
				}
			}
			return &csi.NodePublishVolumeResponse{}, nil
		}
		return nil, status.Errorf(codes.AlreadyExists, "%s is already mounted with other options", target)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return nil, status.Errorf(codes.Internal, "create target parent: %v", err)
	}
	src := d.store.volData(v)
	var pub publication
	pub.ReadOnly = readOnly
	if block {
		f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "create target file: %v", err)
		}
		f.Close()
		if d.cfg.BlockPublish == BlockPublishLoop {
			dev, err := attachLoop(src, readOnly)
			if err != nil {
				return nil, status.Errorf(codes.Internal, "%v", err)
			}
			src, pub.Device = dev, dev
		}
	} else if err := os.MkdirAll(target, 0o755); err != nil {
		return nil, status.Errorf(codes.Internal, "create target dir: %v", err)
	}
	undo := func() {
		_ = unmountAll(target)
		if pub.Device != "" {
			if err := detachLoop(pub.Device); err != nil {
				d.cfg.Logf("%v", err)
			}
		}
	}
	if err := bindMount(src, target, readOnly, flags); err != nil {
		undo()
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	pubs[target] = pub
	if err := d.store.savePublications(v.ID, pubs); err != nil {
		undo()
		return nil, status.Errorf(codes.Internal, "save publications of %s: %v", v.ID, err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	if req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	target := req.GetTargetPath()
	v, err := d.store.getVolume(req.GetVolumeId())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read volume: %v", err)
	}
	pubs, err := d.store.publications(req.GetVolumeId())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read publications: %v", err)
	}
	p, recorded := pubs[target]
	// The loop device behind a Block target: from the record, else from
	// the device node still mounted there (a record lost in a crash).
	dev := p.Device
	if dev == "" {
		if mounted, _ := isMountPoint(target); mounted {
			if at, err := loopDeviceAt(target); err == nil && at != "" {
				dev = at
			}
		}
	}
	if err := unmountAll(target); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "remove target: %v", err)
	}
	if err := d.detachVolumeLoops(v, dev, pubs, target); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if recorded && pubs != nil {
		delete(pubs, target)
		if err := d.store.savePublications(req.GetVolumeId(), pubs); err != nil {
			return nil, status.Errorf(codes.Internal, "save publications: %v", err)
		}
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// detachVolumeLoops detaches the loop device that backed target. With no
// device known, it detaches the loop devices bound to the volume's file that
// no other publication of the volume uses (what a publish that failed
// half-way leaves). It never touches a loop device bound to anything else,
// such as kubelet's own lock device on top of ours.
func (d *Driver) detachVolumeLoops(v *volume, dev string, pubs map[string]publication, target string) error {
	var file string
	if v != nil && v.Block {
		file = d.store.volData(v)
	}
	if dev != "" {
		backing, err := loopBackingFile(dev)
		if err != nil {
			return err
		}
		if backing == "" {
			return nil // already detached
		}
		if (file != "" && backing != file) || (file == "" && !strings.HasPrefix(backing, filepath.Join(d.store.dir, "volumes")+"/")) {
			d.cfg.Logf("not detaching %s: it is bound to %s, not to this volume", dev, backing)
			return nil
		}
		return detachLoop(dev)
	}
	if file == "" || d.cfg.BlockPublish != BlockPublishLoop {
		return nil
	}
	for t, p := range pubs {
		if t != target && p.Device != "" {
			return nil // the volume is published elsewhere; leave its devices
		}
	}
	devs, err := loopsBackedBy(file)
	if err != nil {
		return err
	}
	for _, dv := range devs {
		if err := detachLoop(dv); err != nil {
			return err
		}
	}
	return nil
}

func (d *Driver) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	if req.GetVolumePath() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume path is required")
	}
	d.mu.Lock()
	v, err := d.store.getVolume(req.GetVolumeId())
	d.mu.Unlock()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read volume: %v", err)
	}
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", req.GetVolumeId())
	}
	path := req.GetVolumePath()
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.NotFound, "volume path %s does not exist", path)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "stat %s: %v", path, err)
	}
	if v.Block {
		size := v.CapacityBytes
		if st.Mode()&os.ModeDevice != 0 {
			if n, err := blockDeviceSize(path); err == nil {
				size = n
			}
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	// A Filesystem volume is a directory on the data dir's filesystem, so
	// this is that filesystem's usage: cheap, and what df in the pod shows.
	var fs syscall.Statfs_t
	if err := syscall.Statfs(path, &fs); err != nil {
		return nil, status.Errorf(codes.Internal, "statfs %s: %v", path, err)
	}
	bs := fs.Bsize
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(fs.Blocks) * bs, Available: int64(fs.Bavail) * bs, Used: int64(fs.Blocks-fs.Bfree) * bs},
		{Unit: csi.VolumeUsage_INODES, Total: int64(fs.Files), Available: int64(fs.Ffree), Used: int64(fs.Files - fs.Ffree)},
	}}, nil
}

// refreshLoops makes the loop devices bound to a Block volume's file see its
// new size. Errors are logged: the copy or expansion itself succeeded.
func (d *Driver) refreshLoops(file string) {
	devs, err := loopsBackedBy(file)
	if err != nil {
		d.cfg.Logf("%v", err)
		return
	}
	for _, dev := range devs {
		if err := refreshLoopCapacity(dev); err != nil {
			d.cfg.Logf("%v", err)
		}
	}
}

// flushLoops writes what pods wrote through a Block volume's loop devices
// to its file before the file is copied.
func (d *Driver) flushLoops(file string) {
	devs, err := loopsBackedBy(file)
	if err != nil {
		d.cfg.Logf("%v", err)
		return
	}
	for _, dev := range devs {
		if err := flushLoop(dev); err != nil {
			d.cfg.Logf("%v", err)
		}
	}
}
