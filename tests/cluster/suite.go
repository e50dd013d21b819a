package cluster

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RunMain is a test package's TestMain on one local cluster: it skips the
// package without root, sweeps clusters a killed run left, starts the
// cluster with opts, runs setup on it (what the package's tests share,
// such as a Kubefill stack), then the tests, then setup's teardown, and
// stops the cluster, failing the run if anything of it is left on the host.
// SIGINT and SIGTERM tear down too. `go test -list` lists the tests without
// a cluster. name prefixes its messages. It returns the exit code:
//
//	func TestMain(m *testing.M) { os.Exit(cluster.RunMain(m, "e2e", opts, setup)) }
func RunMain(m *testing.M, name string, opts Options, setup func(*Cluster) (teardown func() error, err error)) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if f := flag.Lookup("test.list"); f != nil && f.Value.String() != "" {
		return m.Run()
	}
	if os.Geteuid() != 0 {
		fmt.Printf("%s: skipped: the local cluster needs root (mounts, network namespaces)\n", name)
		return 0
	}
	if err := SweepStale(); err != nil {
		log.Printf("%s: sweeping stale clusters: %v", name, err)
	}
	if opts.Logf == nil {
		opts.Logf = log.Printf
	}
	start := time.Now()
	c, err := Start(context.Background(), opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: start local cluster: %v\n", name, err)
		return 1
	}
	fmt.Printf("%s: cluster start-up took %s\n", name, time.Since(start).Round(time.Millisecond))

	var (
		mu       sync.Mutex
		teardown func() error
	)
	// Tear down on SIGINT/SIGTERM too, so an interrupted run leaves nothing.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	stopped := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			log.Printf("%s: %v: tearing the cluster down", name, s)
			mu.Lock()
			td := teardown
			teardown = nil
			mu.Unlock()
			if td != nil {
				if err := td(); err != nil {
					log.Printf("%s: %v", name, err)
				}
			}
			if err := c.Stop(); err != nil {
				log.Printf("%s: stop cluster: %v", name, err)
			}
			os.Exit(2)
		case <-stopped:
		}
	}()

	code := 0
	if setup != nil {
		t0 := time.Now()
		td, err := setup(c)
		mu.Lock()
		teardown = td
		mu.Unlock()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: setting up the suite: %v\n", name, err)
			code = 1
		} else {
			fmt.Printf("%s: suite set up in %s\n", name, time.Since(t0).Round(time.Millisecond))
		}
	}
	if code == 0 {
		code = m.Run()
	}
	mu.Lock()
	td := teardown
	teardown = nil
	mu.Unlock()
	if td != nil {
		if err := td(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: tearing the suite down: %v\n", name, err)
			if code == 0 {
				code = 1
			}
		}
	}
	signal.Stop(sigs)
	close(stopped)
	state := c.State()
	stopStart := time.Now()
	if err := c.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: stop local cluster: %v\n", name, err)
		if code == 0 {
			code = 1
		}
	}
	// The harness must leave nothing behind: no process, mount, network
	// namespace, veth or route.
	if left := state.Leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "%s: left behind after Stop: %v\n", name, left)
		if code == 0 {
			code = 1
		}
	} else {
		fmt.Printf("%s: cluster torn down in %s, nothing left behind\n", name, time.Since(stopStart).Round(time.Millisecond))
	}
	return code
}
