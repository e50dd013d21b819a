package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kubefill/kubefill/tests/cluster"
)

// runUploadDemo is the main job's upload: `kubefill upload dv`, exactly as a
// user types it, streams a qcow2 from this machine through the upload proxy
// into a new DataVolume, with its progress bar; a pod then checks the bytes.
func runUploadDemo(ctx context.Context, client kubernetes.Interface, kubeconfig, clusterDir string, disk demoDisk) error {
	dvName := fmt.Sprintf("demo-upload-%d", time.Now().Unix())
	args := []string{"upload", "dv", dvName, "--namespace=" + demoNamespace, "--size=64Mi",
		"--image-path=" + disk.path,
		"--ca-cert=" + cluster.UploadProxyCAFile(clusterDir, cluster.KubefillNamespace),
		"--kubeconfig=" + kubeconfig}
	bin := cluster.DevBinaryPath("kubefill")
	fmt.Printf("uploading a qcow2 of a %d MiB disk from this machine:\n  kubefill %s\n", disk.size>>20, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kubefill upload: %w", err)
	}
	fmt.Printf("upload finished in %s\n", time.Since(start).Round(time.Millisecond))
	return checkClaimBytes(ctx, client, dvName, disk.size, disk.sha)
}
