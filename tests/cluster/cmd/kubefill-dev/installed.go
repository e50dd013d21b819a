package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/tests/cluster"
)

// installedImage is the image `up --installed` runs: built from this
// checkout by hack/images.sh and imported into the node's containerd.
const installedImage = "kubefill/kubefill:dev"

var (
	cdiGVR       = schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "cdis"}
	cdiConfigGVR = schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "cdiconfigs"}
)

// installManifests installs Kubefill on the cluster as an administrator
// would, `kubectl apply -k manifests` then `kubectl apply -k
// manifests/monitoring` (its Prometheus-operator objects are skipped where
// their CRDs are absent), with the locally built image; creates the CDI
// resource, with the upload proxy's cluster IP (reachable from this host
// through the node's bridge) as spec.config.uploadProxyURLOverride; writes
// the proxy's CA bundle where `kubefill upload --ca-cert` and the demo
// look; and prints `kubectl get cdi,deploy -n kubefill-system`.
func installManifests(c *cluster.Cluster) error {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	t0 := time.Now()
	in, err := c.NewInstaller(cluster.InstallOptions{
		Image:        installedImage,
		FieldManager: "kubefill-dev",
		Dirs:         []string{"manifests", filepath.Join("manifests", "monitoring")},
		Logf:         log.Printf,
	})
	if err != nil {
		return err
	}
	log.Printf("installing Kubefill: kubectl apply -k manifests (image %s), kubectl apply -k manifests/monitoring", installedImage)
	if err := in.Install(ctx); err != nil {
		return err
	}
	log.Printf("every Deployment available and APIService %s Available (%s)", cluster.UploadAPIService, time.Since(t0).Round(time.Millisecond))

	proxy, err := c.Client.CoreV1().Services(cluster.KubefillNamespace).Get(ctx, certs.DefaultUploadProxyService, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the upload proxy's Service: %w", err)
	}
	proxyURL := "https://" + net.JoinHostPort(proxy.Spec.ClusterIP, "443")
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	cr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI",
		"metadata": map[string]any{"name": "cdi"},
		"spec":     map[string]any{"config": map[string]any{"uploadProxyURLOverride": proxyURL}},
	}}
	if _, err := dyn.Resource(cdiGVR).Create(ctx, cr, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the CDI resource: %w", err)
	}
	phase := ""
	if err := wait(ctx, "the CDI resource to be Deployed", func() (bool, string) {
		got, err := dyn.Resource(cdiGVR).Get(ctx, "cdi", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		phase, _, _ = unstructured.NestedString(got.Object, "status", "phase")
		return phase == "Deployed", phase
	}); err != nil {
		return err
	}
	if err := wait(ctx, "CDIConfig status.uploadProxyURL to be "+proxyURL, func() (bool, string) {
		got, err := dyn.Resource(cdiConfigGVR).Get(ctx, "config", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		url, _, _ := unstructured.NestedString(got.Object, "status", "uploadProxyURL")
		return url == proxyURL, url
	}); err != nil {
		return err
	}

	bundle, err := c.Client.CoreV1().ConfigMaps(cluster.KubefillNamespace).Get(ctx, certs.BundleName(certs.UploadProxySigner), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the upload proxy's CA bundle: %w", err)
	}
	caFile := cluster.UploadProxyCAFile(c.Dir, cluster.KubefillNamespace)
	if err := os.MkdirAll(filepath.Dir(caFile), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(caFile, []byte(bundle.Data[certs.BundleKey]), 0o644); err != nil {
		return err
	}

	out, err := cluster.GetCDIAndDeployments(ctx, dyn, cluster.KubefillNamespace)
	if err != nil {
		return err
	}
	fmt.Printf("Kubefill installed from the manifests in %s:\n\n$ kubectl get cdi,deploy -n %s\n%s\n", time.Since(t0).Round(time.Millisecond), cluster.KubefillNamespace, out)
	fmt.Printf("upload proxy: %s (CA: %s)\n", proxyURL, caFile)
	return nil
}

// wait polls cond every half second until it holds or ctx ends.
func wait(ctx context.Context, what string, cond func() (bool, string)) error {
	last := ""
	for {
		ok, status := cond()
		if ok {
			return nil
		}
		last = status
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s (last: %s)", what, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
