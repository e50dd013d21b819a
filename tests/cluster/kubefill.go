package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
)

// KubefillNamespace is where the dev cluster's Kubefill keeps its own objects.
const KubefillNamespace = "kubefill-system"

// startKubefill starts `kubefill controller`,
// `kubefill apiserver` and `kubefill uploadproxy` from this checkout as the
// cluster's processes.
func (c *Cluster) startKubefill(ctx context.Context) error {
	t0 := time.Now()
	if c.kubefillBin == "" {
		return errors.New("the kubefill binary did not build; cannot run the Kubefill controller")
	}
	// Kubefill keeps its own objects (the upload CAs) in an install namespace.
	installNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KubefillNamespace}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, installNS, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", KubefillNamespace, err)
	}
	proxyPort, err := FreePort()
	if err != nil {
		return err
	}
	rec, err := c.run("kubefill-controller", nil, c.kubefillBin, "controller",
		"--kubeconfig="+c.Kubeconfig,
		// Published in CDIConfig status, where `kubefill upload` and virtctl look.
		"--uploadproxy-url=https://"+net.JoinHostPort(c.UploadProxyHost(), strconv.Itoa(proxyPort)),
		"--install-namespace="+KubefillNamespace,
		"--leader-elect=false",
		"--metrics-bind-address=0",
		"--health-probe-bind-address=0",
		"--worker-image=kubefill/kubefill:dev",
		// The harness serves the token API itself, with a CA of its own.
		"--apiserver-certificates=false",
	)
	if err != nil {
		return err
	}
	// It has nothing to report readiness through here; make sure it stays up.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * time.Second):
	}
	if !rec.alive() {
		return fmt.Errorf("kubefill controller exited:\n%s", logTail(rec.LogFile, 30))
	}
	c.opts.Logf("cluster: Kubefill CRDs installed and controller running (%s)", time.Since(t0).Round(time.Millisecond))
	if _, err := c.StartUploadServices(ctx, KubefillNamespace, proxyPort); err != nil {
		return fmt.Errorf("starting Kubefill's upload services: %w", err)
	}
	return nil
}

// installCRDs installs the CRDs the options call for (snapshots for
// Storage, Kubefill's for Kubefill and KubefillCRDs) and waits until they
// are established.
func (c *Cluster) installCRDs(ctx context.Context) error {
	var files []string
	if c.opts.Storage {
		dir, err := c.snapshotCRDDir()
		if err != nil {
			return err
		}
		files = append(files, snapshotCRDFiles(dir)...)
	}
	if c.opts.Kubefill || c.opts.KubefillCRDs {
		ours, err := filepath.Glob(filepath.Join(c.repo, "manifests", "crd", "*.yaml"))
		if err != nil {
			return err
		}
		if len(ours) == 0 {
			return fmt.Errorf("no CRDs in %s", filepath.Join(c.repo, "manifests", "crd"))
		}
		files = append(files, ours...)
	}
	if len(files) == 0 {
		return nil
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	return applyCRDs(ctx, dyn, files)
}
