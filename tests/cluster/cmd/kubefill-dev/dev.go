package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/kubefill/kubefill/tests/cluster"
)

// defaultDevDir is where `up` keeps the dev cluster unless told otherwise.
func defaultDevDir() string {
	if d := os.Getenv("KUBEFILL_DEV_DIR"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "kubefill-dev")
}

func runUp(args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	dir := fs.String("dir", defaultDevDir(), "directory for the cluster's state, logs and volumes")
	kubefill := fs.Bool("kubefill", false, "also install Kubefill's CRDs and run its controller from this checkout")
	installed := fs.Bool("installed", false, "install Kubefill as an operator would: `kubectl apply -k manifests` (and the metrics Service of manifests/monitoring) with the image built here, every component a Deployment on the node")
	_ = fs.Parse(args)
	if *kubefill && *installed {
		return errors.New("--kubefill runs Kubefill in-process, --installed from the manifests: pick one")
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	if st, err := cluster.LoadState(*dir); err == nil {
		if st.Running() {
			fmt.Printf("a cluster is already running in %s\nKUBECONFIG=%s\n", *dir, st.Kubeconfig)
			return nil
		}
		log.Printf("removing the remains of a stopped cluster in %s", *dir)
		if err := cluster.Teardown(*dir, true); err != nil {
			return err
		}
	}
	c, err := cluster.Start(context.Background(), cluster.Options{
		Dir:          *dir,
		Storage:      true,
		Node:         true,
		Kubefill:     *kubefill,
		Detach:       true,
		KeepDir:      true,
		HelperBinary: self,
		Logf:         log.Printf,
	})
	if err != nil {
		return err
	}
	fmt.Printf("cluster up in %s\n", c.StartupDuration.Round(1e6))
	if *installed {
		if err := installManifests(c); err != nil {
			return fmt.Errorf("installing Kubefill from the manifests (the cluster stays up; `kubefill-dev down --dir %s` removes it): %w", *dir, err)
		}
	}
	fmt.Printf("KUBECONFIG=%s\n", c.Kubeconfig)
	return nil
}

func runDown(args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	dir := fs.String("dir", defaultDevDir(), "directory `up` used")
	_ = fs.Parse(args)
	if _, err := os.Stat(*dir); errors.Is(err, os.ErrNotExist) {
		fmt.Printf("nothing to do: %s does not exist\n", *dir)
		return nil
	}
	// What it recorded, read before Teardown removes the directory, to check
	// after it that nothing is left on the host.
	st, stErr := cluster.LoadState(*dir)
	if err := cluster.Teardown(*dir, true); err != nil {
		return err
	}
	if stErr == nil {
		if left := st.Leftovers(); len(left) > 0 {
			return fmt.Errorf("left behind after removing the cluster in %s: %v", *dir, left)
		}
	}
	fmt.Printf("removed the cluster in %s\n", *dir)
	return nil
}

func osExecutable() (string, error) {
	p, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find own binary: %w", err)
	}
	return p, nil
}
