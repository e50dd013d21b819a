package hostpath

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/kubefill/kubefill/tests/kit"
)

// serveDriver serves a driver with cfg (Endpoint and DataDir filled in under
// base when empty) until the test ends, and waits for its sockets. It needs
// no root: nothing here mounts.
func serveDriver(t *testing.T, base string, cfg Config) *Driver {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "hostpath.csi.kubefill.test"
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = filepath.Join(base, string(cfg.Mode)+"csi.sock")
	}
	if cfg.DataDir == "" {
		cfg.DataDir = filepath.Join(base, "data")
	}
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	for _, sock := range []string{cfg.Endpoint, cfg.RegistrationSocket} {
		if sock == "" {
			continue
		}
		kit.Eventually(t, 5*time.Second, 10*time.Millisecond, "the socket "+sock+" to appear", func() (bool, string, error) {
			st, err := os.Stat(sock)
			return err == nil && st.Mode()&os.ModeSocket != 0, "", nil
		})
	}
	return d
}

func dialConn(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestRegistration plays kubelet's part of plugin registration against the
// registration socket.
func TestRegistration(t *testing.T) {
	base := t.TempDir()
	regSock := filepath.Join(base, "plugins_registry", "hostpath.csi.kubefill.test-reg.sock")
	// A socket file left by a killed plugin must not stop the next one.
	if err := os.MkdirAll(filepath.Dir(regSock), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(regSock, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	const kubeletEndpoint = "/var/lib/kubelet/plugins/hostpath.csi.kubefill.test/csi.sock"
	ctx, cancel := context.WithCancel(context.Background())
	cfg := Config{Name: "hostpath.csi.kubefill.test", Endpoint: filepath.Join(base, "csi.sock"), DataDir: filepath.Join(base, "data"),
		NodeID: "node-1", Mode: ModeNode, RegistrationSocket: regSock, KubeletEndpoint: kubeletEndpoint, Logf: t.Logf}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-done
		}
	})
	kit.Eventually(t, 5*time.Second, 10*time.Millisecond, "the registration socket to be served", func() (bool, string, error) {
		st, err := os.Stat(regSock)
		return err == nil && st.Mode()&os.ModeSocket != 0, "", nil
	})
	reg := registerapi.NewRegistrationClient(dialConn(t, regSock))

	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	if info.GetType() != registerapi.CSIPlugin || info.GetName() != cfg.Name || info.GetEndpoint() != kubeletEndpoint ||
		!slices.Equal(info.GetSupportedVersions(), []string{"1.0.0"}) {
		t.Fatalf("GetInfo = %+v, want CSIPlugin %s at %s speaking 1.0.0", info, cfg.Name, kubeletEndpoint)
	}
	if d.reg.lastStatus() != nil {
		t.Fatal("a registration status before kubelet sent one")
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: false, Error: "version mismatch"}); err != nil {
		t.Fatalf("NotifyRegistrationStatus(failed): %v", err)
	}
	if st := d.reg.lastStatus(); st == nil || st.GetPluginRegistered() || st.GetError() != "version mismatch" {
		t.Fatalf("status after a failed registration = %+v", st)
	}
	// A failed registration does not stop the plugin: kubelet may retry.
	if _, err := reg.GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
		t.Fatalf("GetInfo after a failed registration: %v", err)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatalf("NotifyRegistrationStatus(ok): %v", err)
	}
	if st := d.reg.lastStatus(); !st.GetPluginRegistered() {
		t.Fatalf("status after registration = %+v", st)
	}
	// What kubelet does next: dial the CSI socket and ask for the node id.
	ni, err := csi.NewNodeClient(dialConn(t, cfg.Endpoint)).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil || ni.GetNodeId() != "node-1" {
		t.Fatalf("NodeGetInfo = %v, %v; want node-1", ni, err)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	stopped = true
	for _, sock := range []string{regSock, cfg.Endpoint} {
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("%s still there after shutdown (%v)", sock, err)
		}
	}
}

// TestModes checks which services each mode serves.
func TestModes(t *testing.T) {
	for _, tc := range []struct {
		mode             Mode
		controller, node bool
	}{
		{ModeAll, true, true},
		{ModeController, true, false},
		{ModeNode, false, true},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			base := t.TempDir()
			cfg := Config{Mode: tc.mode, NodeID: "node-1"}
			if tc.mode == ModeController {
				cfg.NodeID = "" // not needed without the node service
			}
			d := serveDriver(t, base, cfg)
			conn := dialConn(t, d.cfg.Endpoint)
			ctx := context.Background()
			if _, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}); err != nil {
				t.Fatalf("Probe: %v", err)
			}
			caps, err := csi.NewIdentityClient(conn).GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			hasCtrl := slices.ContainsFunc(caps.GetCapabilities(), func(c *csi.PluginCapability) bool {
				return c.GetService().GetType() == csi.PluginCapability_Service_CONTROLLER_SERVICE
			})
			if hasCtrl != tc.controller {
				t.Errorf("CONTROLLER_SERVICE advertised = %v, want %v", hasCtrl, tc.controller)
			}
			_, err = csi.NewControllerClient(conn).ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
			if got := status.Code(err) != codes.Unimplemented; got != tc.controller {
				t.Errorf("controller service served = %v (%v), want %v", got, err, tc.controller)
			}
			_, err = csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
			if got := status.Code(err) != codes.Unimplemented; got != tc.node {
				t.Errorf("node service served = %v (%v), want %v", got, err, tc.node)
			}
		})
	}
}

func TestModeConfig(t *testing.T) {
	base := t.TempDir()
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"default is all", Config{NodeID: "n"}, true},
		{"unknown mode", Config{Mode: "both", NodeID: "n"}, false},
		{"node needs a node id", Config{Mode: ModeNode}, false},
		{"controller needs none", Config{Mode: ModeController}, true},
		{"registration needs the node service", Config{Mode: ModeController, RegistrationSocket: filepath.Join(base, "r.sock")}, false},
		{"unknown block publish", Config{NodeID: "n", BlockPublish: "dm"}, false},
	} {
		cfg := tc.cfg
		cfg.Name, cfg.Endpoint, cfg.DataDir = "x.test", filepath.Join(base, "s.sock"), filepath.Join(base, "data")
		d, err := New(cfg)
		if (err == nil) != tc.ok {
			t.Errorf("%s: New err = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if tc.name == "default is all" && err == nil && (d.cfg.Mode != ModeAll || d.cfg.BlockPublish != BlockPublishFile || d.cfg.KubeletEndpoint != cfg.Endpoint) {
			t.Errorf("defaults: mode %s, block publish %s, kubelet endpoint %s", d.cfg.Mode, d.cfg.BlockPublish, d.cfg.KubeletEndpoint)
		}
	}
	d, err := New(Config{Name: "x.test", Endpoint: filepath.Join(base, "s.sock"), DataDir: filepath.Join(base, "data"), NodeID: "n", Mode: ModeNode})
	if err != nil || d.cfg.BlockPublish != BlockPublishLoop {
		t.Errorf("node mode publishes Block volumes as %v (%v), want loop devices", d.cfg.BlockPublish, err)
	}
	for in, want := range map[string]Mode{"": ModeAll, "all": ModeAll, "controller": ModeController, "node": ModeNode} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseMode("Node"); err == nil {
		t.Error("ParseMode accepted Node")
	}
}
