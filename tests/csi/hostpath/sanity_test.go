package hostpath

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/kubefill/kubefill/tests/internal/mountinfo"
	"github.com/kubefill/kubefill/tests/kit"
)

// startDriver serves a driver on a socket in a temporary directory and
// returns its address and data dir.
func startDriver(t *testing.T) (endpoint, dataDir, base string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the hostpath driver bind-mounts volumes: needs root")
	}
	base = t.TempDir()
	// Whatever a failed run left mounted must go before TempDir's removal.
	t.Cleanup(func() { unmountBelow(t, base) })
	endpoint = filepath.Join(base, "csi.sock")
	dataDir = filepath.Join(base, "data")
	d, err := New(Config{Name: "hostpath.csi.kubefill.test", Endpoint: endpoint, DataDir: dataDir, NodeID: "sanity-node", Logf: t.Logf})
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
	kit.Eventually(t, 5*time.Second, 10*time.Millisecond, "the driver socket "+endpoint+" to appear", func() (bool, string, error) {
		_, err := os.Stat(endpoint)
		return err == nil, "", err
	})
	return endpoint, dataDir, base
}

func unmountBelow(t *testing.T, dir string) {
	all, err := mountinfo.MountPoints()
	if err != nil {
		t.Errorf("%v", err)
		return
	}
	var mounts []string
	for _, mp := range all {
		if strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	for _, m := range mounts {
		t.Errorf("left mounted: %s", m)
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

func sanityConfig(endpoint, base string) sanity.TestConfig {
	cfg := sanity.NewTestConfig()
	cfg.Address = "unix://" + endpoint
	cfg.TargetPath = filepath.Join(base, "target")
	cfg.StagingPath = filepath.Join(base, "staging")
	cfg.TestVolumeSize = 16 << 20
	cfg.TestVolumeExpandSize = 32 << 20
	cfg.IdempotentCount = 2
	return cfg
}

// TestSanity runs the upstream CSI conformance suite (csi-test's
// pkg/sanity) against the driver with filesystem volumes. Ginkgo allows one
// suite per process, so block volumes are covered by TestBlockVolumes.
func TestSanity(t *testing.T) {
	endpoint, _, base := startDriver(t)
	sanity.Test(t, sanityConfig(endpoint, base))
}
