package hostpath

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// registrar serves kubelet's plugin registration API on a socket in
// <kubelet-root>/plugins_registry, in place of node-driver-registrar: kubelet
// finds the socket, asks GetInfo where the CSI socket is, dials it
// (NodeGetInfo), and reports the outcome with NotifyRegistrationStatus.
type registrar struct {
	registerapi.UnimplementedRegistrationServer

	name     string
	endpoint string
	logf     func(format string, args ...any)

	mu     sync.Mutex
	status *registerapi.RegistrationStatus
}

// supportedCSIVersions are the CSI spec versions kubelet may speak to us.
var supportedCSIVersions = []string{"1.0.0"}

func (r *registrar) GetInfo(ctx context.Context, req *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	r.logf("plugin registration: GetInfo from kubelet: %s at %s", r.name, r.endpoint)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.name,
		Endpoint:          r.endpoint,
		SupportedVersions: supportedCSIVersions,
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(ctx context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.mu.Lock()
	r.status = st
	r.mu.Unlock()
	if st.GetPluginRegistered() {
		r.logf("plugin registration: kubelet registered %s", r.name)
	} else {
		// node-driver-registrar exits here so that its pod restarts; we keep
		// serving, as kubelet retries when the socket is recreated or it
		// restarts, and the log says why.
		r.logf("plugin registration: kubelet failed to register %s: %s", r.name, st.GetError())
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// lastStatus is what kubelet last reported (nil before it did).
func (r *registrar) lastStatus() *registerapi.RegistrationStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// listenUnix removes a stale socket and listens on a fresh one.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create socket dir: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return lis, nil
}

// serve serves the registration API on path until ctx is done,
// then removes the socket, which is how kubelet learns the plugin is gone.
func (r *registrar) serve(ctx context.Context, path string) error {
	lis, err := listenUnix(path)
	if err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, r)
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	err = srv.Serve(lis)
	if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
		r.logf("remove registration socket %s: %v", path, rmErr)
	}
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve plugin registration: %w", err)
	}
	return nil
}
