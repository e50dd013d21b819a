// Package e2e holds end-to-end tests against one real local cluster per
// package run (see tests/cluster): real control plane, real CSI sidecars,
// our hostpath CSI driver, and a real node: kubelet, containerd, kube-proxy
// and CoreDNS running pods from images built here.
package e2e

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/kubefill/kubefill/tests/cluster"
)

// cl is the cluster every test in this package shares.
var cl *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Println("e2e: skipped: the local cluster needs root (mounts, network namespaces)")
		return 0
	}
	// A run killed earlier (timeout, crash) may have left a cluster behind.
	if err := cluster.SweepStale(); err != nil {
		log.Printf("e2e: sweeping stale clusters: %v", err)
	}
	start := time.Now()
	c, err := cluster.Start(context.Background(), cluster.Options{
		Storage: true,
		Node:    true,
		// Before kube-controller-manager starts, so that its garbage
		// collector follows DataVolumes from the first test on.
		KubefillCRDs: true,
		Logf:         log.Printf,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: start local cluster: %v\n", err)
		return 1
	}
	cl = c
	fmt.Printf("e2e: cluster start-up took %s\n", time.Since(start).Round(time.Millisecond))

	// Tear down on SIGINT/SIGTERM too, so an interrupted run leaves nothing.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		log.Printf("e2e: %v: tearing the cluster down", s)
		if err := c.Stop(); err != nil {
			log.Printf("e2e: stop cluster: %v", err)
		}
		os.Exit(2)
	}()

	code := m.Run()
	signal.Stop(sigs)
	state := c.State()
	stopStart := time.Now()
	if err := c.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: stop local cluster: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	// The harness must leave nothing behind: no process, mount, network
	// namespace, veth or route.
	if left := state.Leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "e2e: left behind after Stop: %v\n", left)
		if code == 0 {
			code = 1
		}
	} else {
		fmt.Printf("e2e: cluster torn down in %s, nothing left behind\n", time.Since(stopStart).Round(time.Millisecond))
	}
	return code
}
