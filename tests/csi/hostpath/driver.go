package hostpath

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Version is the driver's reported vendor version.
const Version = "0.1.0"

// defaultVolumeSize is used when a CreateVolume asks for no capacity.
const defaultVolumeSize int64 = 1 << 30

// Mode says which CSI services a driver process serves.
type Mode string

const (
	// ModeAll serves Identity, Controller and Node from one process on the
	// host (the node agent's setup).
	ModeAll Mode = "all"
	// ModeController serves Identity and Controller, for the sidecars on
	// the host (provisioner, snapshotter, resizer).
	ModeController Mode = "controller"
	// ModeNode serves Identity and Node, as the node plugin kubelet calls.
	ModeNode Mode = "node"
)

// ParseMode reads a --mode value ("" is ModeAll).
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case "":
		return ModeAll, nil
	case ModeAll, ModeController, ModeNode:
		return m, nil
	}
	return "", fmt.Errorf("unknown mode %q (want all, controller or node)", s)
}

func (m Mode) controller() bool { return m == ModeAll || m == ModeController }
func (m Mode) node() bool       { return m == ModeAll || m == ModeNode }

// BlockPublish says how NodePublishVolume places a Block volume at its
// target path.
type BlockPublish string

const (
	// BlockPublishLoop attaches the backing file to a loop device and
	// bind-mounts the device node at the target: what kubelet needs.
	BlockPublishLoop BlockPublish = "loop"
	// BlockPublishFile bind-mounts the backing file itself at the target:
	// what the node agent's host processes use.
	BlockPublishFile BlockPublish = "file"
)

// Config configures a Driver.
type Config struct {
	// Name is the CSI driver name, DNS-like (hostpath.csi.kubefill.test).
	Name string
	// Endpoint is the unix socket path to serve on.
	Endpoint string
	// DataDir holds the volumes and snapshots. A controller-mode and a
	// node-mode process may share it; both must see it at the same path.
	DataDir string
	// NodeID is what NodeGetInfo reports (the Node's name). Required when
	// the Node service is served.
	NodeID string
	// Mode picks the services. Default ModeAll.
	Mode Mode
	// RegistrationSocket, when set, is where the driver serves kubelet's
	// plugin registration API (<kubelet-root>/plugins_registry/<name>-reg.sock).
	// Only with the Node service.
	RegistrationSocket string
	// KubeletEndpoint is the CSI socket path kubelet must dial, reported at
	// registration. Default: Endpoint.
	KubeletEndpoint string
	// BlockPublish picks how Block volumes are published. Default: loop
	// devices in ModeNode, the backing file otherwise.
	BlockPublish BlockPublish
	// Logf receives one line per call. Default: discard.
	Logf func(format string, args ...any)
}

// Driver serves the CSI Identity, Controller and Node services.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	cfg   Config
	store *store
	reg   *registrar
	// mu serialises every call: volumes are small and tests are what run
	// against this driver, so simplicity wins over concurrency.
	mu sync.Mutex
}

// New checks the config and prepares the data directory.
func New(cfg Config) (*Driver, error) {
	if cfg.Mode == "" {
		cfg.Mode = ModeAll
	}
	if _, err := ParseMode(string(cfg.Mode)); err != nil {
		return nil, fmt.Errorf("hostpath CSI driver: %w", err)
	}
	if cfg.Name == "" || cfg.Endpoint == "" || cfg.DataDir == "" {
		return nil, errors.New("hostpath CSI driver: name, endpoint and data dir are all required")
	}
	if cfg.Mode.node() && cfg.NodeID == "" {
		return nil, errors.New("hostpath CSI driver: the node service needs a node id")
	}
	if cfg.RegistrationSocket != "" && !cfg.Mode.node() {
		return nil, fmt.Errorf("hostpath CSI driver: kubelet registration needs the node service, not mode %s", cfg.Mode)
	}
	if cfg.KubeletEndpoint == "" {
		cfg.KubeletEndpoint = cfg.Endpoint
	}
	switch cfg.BlockPublish {
	case "":
		cfg.BlockPublish = BlockPublishFile
		if cfg.Mode == ModeNode {
			cfg.BlockPublish = BlockPublishLoop
		}
	case BlockPublishLoop, BlockPublishFile:
	default:
		return nil, fmt.Errorf("hostpath CSI driver: unknown block publish %q (want loop or file)", cfg.BlockPublish)
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	st, err := newStore(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("hostpath CSI driver: %w", err)
	}
	d := &Driver{cfg: cfg, store: st}
	if cfg.RegistrationSocket != "" {
		d.reg = &registrar{name: cfg.Name, endpoint: cfg.KubeletEndpoint, logf: cfg.Logf}
	}
	return d, nil
}

// Serve listens on the unix socket (and the registration socket, if any)
// and serves until ctx is done.
func (d *Driver) Serve(ctx context.Context) error {
	lis, err := listenUnix(d.cfg.Endpoint)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.logCalls))
	csi.RegisterIdentityServer(srv, d)
	if d.cfg.Mode.controller() {
		csi.RegisterControllerServer(srv, d)
	}
	if d.cfg.Mode.node() {
		csi.RegisterNodeServer(srv, d)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	regDone := make(chan error, 1)
	if d.reg != nil {
		// The CSI socket listens already, so kubelet can dial it as soon
		// as it sees the registration socket.
		go func() {
			err := d.reg.serve(ctx, d.cfg.RegistrationSocket)
			if err != nil {
				cancel()
			}
			regDone <- err
		}()
	} else {
		regDone <- nil
	}
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	err = srv.Serve(lis)
	cancel()
	regErr := <-regDone
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve CSI: %w", err)
	}
	return regErr
}

// logCalls logs one line per call: the method, for CreateVolume and
// CreateSnapshot the object's name and source, and how long the call took
// as "took=<nanoseconds>ns", which benchmarks subtract from their totals
// (see ParseCallLog).
func (d *Driver) logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	took := time.Since(start)
	what := ""
	switch r := req.(type) {
	case *csi.CreateVolumeRequest:
		what = " name=" + r.GetName()
		if s := r.GetVolumeContentSource(); s.GetSnapshot() != nil {
			what += " from-snapshot=" + s.GetSnapshot().GetSnapshotId()
		} else if s.GetVolume() != nil {
			what += " from-volume=" + s.GetVolume().GetVolumeId()
		}
	case *csi.CreateSnapshotRequest:
		what = " name=" + r.GetName() + " source=" + r.GetSourceVolumeId()
	}
	if err != nil {
		d.cfg.Logf("%s%s (%s) took=%dns: %v", info.FullMethod, what, took.Round(time.Microsecond), took.Nanoseconds(), err)
	} else {
		d.cfg.Logf("%s%s (%s) took=%dns: ok", info.FullMethod, what, took.Round(time.Microsecond), took.Nanoseconds())
	}
	return resp, err
}

// DelayParameter, as a StorageClass parameter, makes CreateVolume of a
// clone or a restore of that class wait this long (a Go duration) before it
// copies; as a VolumeSnapshotClass parameter it does the same for
// CreateSnapshot. Tests use it to act while a CSI clone or a snapshot is in
// flight. Plain provisioning is never delayed.
const DelayParameter = "kubefill.test/delay"

// delay waits for the duration params[DelayParameter], outside the driver's
// lock, so other calls go on meanwhile.
func delay(ctx context.Context, params map[string]string) error {
	v, ok := params[DelayParameter]
	if !ok {
		return nil
	}
	dur, err := time.ParseDuration(v)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "parameter %s=%q is not a duration: %v", DelayParameter, v, err)
	}
	select {
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-time.After(dur):
		return nil
	}
}

// Identity service.

func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.cfg.Name, VendorVersion: Version}, nil
}

func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	caps := []*csi.PluginCapability{
		{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE}}},
	}
	if d.cfg.Mode.controller() {
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}})
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

func (d *Driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

// Controller service.

func (d *Driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, c := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// accessType checks a request's capabilities and tells whether they ask for
// a block volume. Mixing block and mount is an error.
func accessType(caps []*csi.VolumeCapability) (block bool, err error) {
	if len(caps) == 0 {
		return false, status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	var sawBlock, sawMount bool
	for _, c := range caps {
		if c == nil || c.GetAccessMode() == nil {
			return false, status.Error(codes.InvalidArgument, "each volume capability needs an access mode")
		}
		switch {
		case c.GetBlock() != nil:
			sawBlock = true
		case c.GetMount() != nil:
			sawMount = true
		default:
			return false, status.Error(codes.InvalidArgument, "each volume capability needs an access type (block or mount)")
		}
	}
	if sawBlock && sawMount {
		return false, status.Error(codes.InvalidArgument, "a volume cannot be both block and mount")
	}
	return sawBlock, nil
}

// requestedSize picks a size from a capacity range.
func requestedSize(r *csi.CapacityRange) (int64, error) {
	if r == nil {
		return defaultVolumeSize, nil
	}
	req, lim := r.GetRequiredBytes(), r.GetLimitBytes()
	if req < 0 || lim < 0 {
		return 0, status.Error(codes.InvalidArgument, "capacity cannot be negative")
	}
	if lim > 0 && req > lim {
		return 0, status.Errorf(codes.InvalidArgument, "required bytes %d exceed limit bytes %d", req, lim)
	}
	switch {
	case req > 0:
		return req, nil
	case lim > 0 && lim < defaultVolumeSize:
		return lim, nil
	default:
		return defaultVolumeSize, nil
	}
}

func fitsRange(size int64, r *csi.CapacityRange) bool {
	if r == nil {
		return true
	}
	if r.GetRequiredBytes() > 0 && size < r.GetRequiredBytes() {
		return false
	}
	if r.GetLimitBytes() > 0 && size > r.GetLimitBytes() {
		return false
	}
	return true
}

func (d *Driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume name is required")
	}
	block, err := accessType(req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	size, err := requestedSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	src := req.GetVolumeContentSource()
	var fromSnap, fromVol string
	if src != nil {
		switch {
		case src.GetSnapshot() != nil:
			fromSnap = src.GetSnapshot().GetSnapshotId()
		case src.GetVolume() != nil:
			fromVol = src.GetVolume().GetVolumeId()
		default:
			return nil, status.Error(codes.InvalidArgument, "unknown volume content source")
		}
	}

	if src != nil {
		if err := delay(ctx, req.GetParameters()); err != nil {
			return nil, err
		}
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	id := idFor("vol-", req.GetName())
	existing, err := d.store.getVolume(id)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read volume %s: %v", id, err)
	}
	if existing != nil {
		if existing.Block != block || !fitsRange(existing.CapacityBytes, req.GetCapacityRange()) ||
			existing.FromSnapshot != fromSnap || existing.FromVolume != fromVol {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with a different size, access type or source", req.GetName())
		}
		return &csi.CreateVolumeResponse{Volume: d.csiVolume(existing, src)}, nil
	}

	v := &volume{ID: id, Name: req.GetName(), CapacityBytes: size, Block: block,
		FromSnapshot: fromSnap, FromVolume: fromVol, Parameters: req.GetParameters()}
	switch {
	case fromSnap != "":
		sn, err := d.store.getSnapshot(fromSnap)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "read snapshot %s: %v", fromSnap, err)
		}
		if sn == nil {
			return nil, status.Errorf(codes.NotFound, "source snapshot %s does not exist", fromSnap)
		}
		if sn.Block != block {
			return nil, status.Errorf(codes.InvalidArgument, "snapshot %s is of a %s volume, the request is for a %s volume", fromSnap, kind(sn.Block), kind(block))
		}
		if sn.Block && sn.SizeBytes > size {
			return nil, status.Errorf(codes.OutOfRange, "snapshot %s holds %d bytes, more than the requested %d", fromSnap, sn.SizeBytes, size)
		}
		if err := copyData(d.store.snapData(sn), d.store.volData(v), block, size); err != nil {
			_ = removeData(d.store.volData(v))
			return nil, status.Errorf(codes.Internal, "restore snapshot %s: %v", fromSnap, err)
		}
	case fromVol != "":
		sv, err := d.store.getVolume(fromVol)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "read volume %s: %v", fromVol, err)
		}
		if sv == nil {
			return nil, status.Errorf(codes.NotFound, "source volume %s does not exist", fromVol)
		}
		if sv.Block != block {
			return nil, status.Errorf(codes.InvalidArgument, "volume %s is a %s volume, the request is for a %s volume", fromVol, kind(sv.Block), kind(block))
		}
		if sv.CapacityBytes > size {
			return nil, status.Errorf(codes.OutOfRange, "source volume %s has %d bytes, more than the requested %d", fromVol, sv.CapacityBytes, size)
		}
		if block {
			d.flushLoops(d.store.volData(sv))
		}
		if err := copyData(d.store.volData(sv), d.store.volData(v), block, size); err != nil {
			_ = removeData(d.store.volData(v))
			return nil, status.Errorf(codes.Internal, "clone volume %s: %v", fromVol, err)
		}
	default:
		if err := d.store.createVolumeData(v); err != nil {
			_ = removeData(d.store.volData(v))
			return nil, status.Errorf(codes.Internal, "create volume: %v", err)
		}
	}
	if err := d.store.saveVolume(v); err != nil {
		_ = removeData(d.store.volData(v))
		return nil, status.Errorf(codes.Internal, "save volume %s: %v", id, err)
	}
	return &csi.CreateVolumeResponse{Volume: d.csiVolume(v, src)}, nil
}

func kind(block bool) string {
	if block {
		return "block"
	}
	return "filesystem"
}

func (d *Driver) csiVolume(v *volume, src *csi.VolumeContentSource) *csi.Volume {
	return &csi.Volume{
		VolumeId:      v.ID,
		CapacityBytes: v.CapacityBytes,
		ContentSource: src,
		VolumeContext: map[string]string{"kind": kind(v.Block)},
	}
}

func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	v, err := d.store.getVolume(req.GetVolumeId())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read volume: %v", err)
	}
	if v == nil {
		return &csi.DeleteVolumeResponse{}, nil
	}
	// The node side's records are read only, and only trusted while the
	// target is still mounted: a node plugin that went away leaves stale ones.
	pubs, err := d.store.publications(v.ID)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read publications: %v", err)
	}
	for target := range pubs {
		if mounted, _ := isMountPoint(target); mounted {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published at %s", v.ID, target)
		}
	}
	if err := removeData(d.store.volData(v)); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	// Stale records of a volume that is gone would otherwise stay forever
	// (the one place the controller side touches published/).
	if err := os.Remove(d.store.pubMeta(v.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.cfg.Logf("remove stale publications of %s: %v", v.ID, err)
	}
	if err := os.Remove(d.store.volMeta(v.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "remove volume metadata: %v", err)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (d *Driver) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	block, err := accessType(req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
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
		return &csi.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("volume %s is a %s volume", v.ID, kind(v.Block))}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

func (d *Driver) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "capacity range is required")
	}
	size, err := requestedSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	v, err := d.store.getVolume(req.GetVolumeId())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read volume: %v", err)
	}
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", req.GetVolumeId())
	}
	if size > v.CapacityBytes {
		if v.Block {
			if err := os.Truncate(d.store.volData(v), size); err != nil {
				return nil, status.Errorf(codes.Internal, "grow block file: %v", err)
			}
			// A loop device keeps its old size until told: the
			// published device grows with the file, as online expansion
			// promises. Best effort; the node refreshes it on publish too.
			d.refreshLoops(d.store.volData(v))
		}
		v.CapacityBytes = size
		if err := d.store.saveVolume(v); err != nil {
			return nil, status.Errorf(codes.Internal, "save volume: %v", err)
		}
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes, NodeExpansionRequired: false}, nil
}

func (d *Driver) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot name is required")
	}
	if req.GetSourceVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "source volume id is required")
	}
	if err := delay(ctx, req.GetParameters()); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	id := idFor("snap-", req.GetName())
	existing, err := d.store.getSnapshot(id)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read snapshot: %v", err)
	}
	if existing != nil {
		if existing.SourceVolumeID != req.GetSourceVolumeId() {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists for another source volume", req.GetName())
		}
		return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(existing)}, nil
	}
	v, err := d.store.getVolume(req.GetSourceVolumeId())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read volume: %v", err)
	}
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "source volume %s does not exist", req.GetSourceVolumeId())
	}
	sn := &snapshot{ID: id, Name: req.GetName(), SourceVolumeID: v.ID, Block: v.Block, CreationTime: time.Now().UTC()}
	if v.Block {
		d.flushLoops(d.store.volData(v))
	}
	if err := copyData(d.store.volData(v), d.store.snapData(sn), v.Block, 0); err != nil {
		_ = removeData(d.store.snapData(sn))
		return nil, status.Errorf(codes.Internal, "copy volume %s: %v", v.ID, err)
	}
	// A snapshot restores to a volume of at least its source's size.
	sn.SizeBytes = v.CapacityBytes
	if err := d.store.saveSnapshot(sn); err != nil {
		_ = removeData(d.store.snapData(sn))
		return nil, status.Errorf(codes.Internal, "save snapshot: %v", err)
	}
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(sn)}, nil
}

func csiSnapshot(sn *snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     sn.ID,
		SourceVolumeId: sn.SourceVolumeID,
		SizeBytes:      sn.SizeBytes,
		CreationTime:   timestamppb.New(sn.CreationTime),
		ReadyToUse:     true,
	}
}

func (d *Driver) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot id is required")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	sn, err := d.store.getSnapshot(req.GetSnapshotId())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read snapshot: %v", err)
	}
	if sn == nil {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if err := removeData(d.store.snapData(sn)); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if err := os.Remove(d.store.snapMeta(sn.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "remove snapshot metadata: %v", err)
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

func (d *Driver) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max entries cannot be negative")
	}
	d.mu.Lock()
	all, err := d.store.listSnapshots()
	d.mu.Unlock()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "list snapshots: %v", err)
	}
	var matched []*snapshot
	for _, sn := range all {
		if req.GetSnapshotId() != "" && sn.ID != req.GetSnapshotId() {
			continue
		}
		if req.GetSourceVolumeId() != "" && sn.SourceVolumeID != req.GetSourceVolumeId() {
			continue
		}
		matched = append(matched, sn)
	}
	start := 0
	if tok := req.GetStartingToken(); tok != "" {
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 || n > len(matched) {
			return nil, status.Errorf(codes.Aborted, "invalid starting token %q", tok)
		}
		start = n
	}
	end := len(matched)
	if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
		end = start + m
	}
	resp := &csi.ListSnapshotsResponse{}
	for _, sn := range matched[start:end] {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(sn)})
	}
	if end < len(matched) {
		resp.NextToken = strconv.Itoa(end)
	}
	return resp, nil
}
