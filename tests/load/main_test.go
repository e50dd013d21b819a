// Package load measures Kubefill's controller under load and at scale, as a
// separate process (the built `kubefill controller`, reached only through
// its kubeconfig and its metrics endpoint) against one local cluster
// (tests/cluster):
//
//   - TestDataVolumeLoad: many DataVolumes at once on the real node (blank
//     and small HTTP imports mixed, and clones of one source), all
//     Succeeded; the time to the last and the controller's peak RSS.
//   - TestScale: a control plane holding many PVCs, pods and StorageClasses
//     that are none of Kubefill's business, and the finished DataVolumes; a
//     new controller's peak RSS once it has synced, and that it goes quiet:
//     with nothing changing, its request rate to kube-apiserver a minute on
//     is near zero (KUBEFILL_LOAD_DV_IDLE=1 also checks the first
//     controller's, a minute after the last DataVolume succeeded).
//
// The counts come from the environment (see loadCounts); the defaults are
// the CI's small ones, `make bench-load` sets the full ones. The goals are
// asserted, and the figures printed as "load: ..." lines.
package load

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kubefill/kubefill/tests/cluster"
)

var (
	// cl is the cluster every test in this package shares.
	cl *cluster.Cluster
	// kubefillBin is the kubefill binary built from this checkout.
	kubefillBin string
	// withNode is whether cl runs a real node (KUBEFILL_LOAD_NODE=0 starts
	// only the control plane: TestScale runs, TestDataVolumeLoad skips).
	withNode bool
	// counts are the sizes the tests use.
	counts loadCounts
)

// loadCounts are the sizes of the load and the scale tests.
type loadCounts struct {
	// PVCs, Pods and Classes are the unrelated objects TestScale creates.
	PVCs, Pods, Classes int
	// DataVolumes is how many DataVolumes TestDataVolumeLoad creates at
	// once; Clones of them clone one source, the rest are blank and small
	// HTTP imports, mixed.
	DataVolumes, Clones int
}

// countsFromEnv reads KUBEFILL_LOAD_{PVCS,PODS,CLASSES,DVS,CLONES}; unset
// ones keep the CI's defaults.
func countsFromEnv() (loadCounts, error) {
	c := loadCounts{PVCs: 2000, Pods: 2000, Classes: 50, DataVolumes: 20, Clones: 5}
	for _, f := range []struct {
		env string
		v   *int
	}{
		{"KUBEFILL_LOAD_PVCS", &c.PVCs},
		{"KUBEFILL_LOAD_PODS", &c.Pods},
		{"KUBEFILL_LOAD_CLASSES", &c.Classes},
		{"KUBEFILL_LOAD_DVS", &c.DataVolumes},
		{"KUBEFILL_LOAD_CLONES", &c.Clones},
	} {
		s := os.Getenv(f.env)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return c, fmt.Errorf("%s=%q: want a count (a whole number >= 0)", f.env, s)
		}
		*f.v = n
	}
	if c.Clones > c.DataVolumes {
		return c, fmt.Errorf("KUBEFILL_LOAD_CLONES=%d is more than KUBEFILL_LOAD_DVS=%d (the clones are among the DataVolumes)", c.Clones, c.DataVolumes)
	}
	return c, nil
}

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	var err error
	if counts, err = countsFromEnv(); err != nil {
		fmt.Fprintf(os.Stderr, "load: %v\n", err)
		return 2
	}
	withNode = os.Getenv("KUBEFILL_LOAD_NODE") != "0"
	// The controller under test logs to its own file; the test's clients
	// have nothing to say.
	ctrllog.SetLogger(logr.Discard())
	if withNode && os.Geteuid() != 0 {
		fmt.Println("load: skipped: the local cluster's node needs root (mounts, network namespaces)")
		return 0
	}
	if err := cluster.SweepStale(); err != nil {
		log.Printf("load: sweeping stale clusters: %v", err)
	}
	start := time.Now()
	// On the cluster hack/test.sh shares with tests/installed, or one of its own.
	c, err := cluster.StartOrAttach(context.Background(), cluster.Options{
		Storage: withNode,
		Node:    withNode,
		// Before kube-controller-manager starts, so that its garbage
		// collector follows DataVolumes from the start.
		KubefillCRDs: true,
		Logf:         log.Printf,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "load: start local cluster: %v\n", err)
		return 1
	}
	cl = c
	fmt.Printf("load: cluster start-up took %s (real node: %v)\n", time.Since(start).Round(time.Millisecond), withNode)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		log.Printf("load: %v: tearing the cluster down", s)
		if err := c.Stop(); err != nil {
			log.Printf("load: stop cluster: %v", err)
		}
		os.Exit(2)
	}()

	code := func() int {
		kubefillBin = c.KubefillBinary()
		if kubefillBin == "" {
			// Without a node the harness builds no kubefill binary.
			dir, err := os.MkdirTemp("", "kubefill-load-bin-")
			if err != nil {
				fmt.Fprintf(os.Stderr, "load: %v\n", err)
				return 1
			}
			defer os.RemoveAll(dir)
			if kubefillBin, err = buildKubefill(dir); err != nil {
				fmt.Fprintf(os.Stderr, "load: %v\n", err)
				return 1
			}
		}
		return m.Run()
	}()
	signal.Stop(sigs)
	if err := c.StopAndCheck(); err != nil {
		fmt.Fprintf(os.Stderr, "load: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// buildKubefill builds ./cmd/kubefill of this checkout into dir.
func buildKubefill(dir string) (string, error) {
	repo, err := cluster.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kubefill")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kubefill")
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/kubefill: %v\n%s", err, out)
	}
	return bin, nil
}
