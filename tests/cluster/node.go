package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var metav1GetOptions = metav1.GetOptions{}

// subnetLeaseDir holds one file per pod subnet in use on this machine, so
// that clusters running side by side (test packages run in parallel) never
// share an address range.
const subnetLeaseDir = "/run/kubefill/pod-subnets"

// leasePodSubnet picks a free 10.244.<n>.0/24 and records it for this
// cluster. A lease whose cluster directory is gone is stale and reused.
func leasePodSubnet(clusterDir string) (subnet, lease string, err error) {
	if err := os.MkdirAll(subnetLeaseDir, 0o755); err != nil {
		return "", "", fmt.Errorf("create %s: %w", subnetLeaseDir, err)
	}
	for n := 1; n < 255; n++ {
		lease = filepath.Join(subnetLeaseDir, strconv.Itoa(n))
		f, err := os.OpenFile(lease, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if errors.Is(err, os.ErrExist) {
			owner, rerr := os.ReadFile(lease)
			if rerr == nil {
				if _, serr := os.Stat(filepath.Join(strings.TrimSpace(string(owner)), stateFile)); errors.Is(serr, os.ErrNotExist) {
					_ = os.Remove(lease)
					n-- // try this one again
				}
			}
			continue
		}
		if err != nil {
			return "", "", fmt.Errorf("lease pod subnet: %w", err)
		}
		_, werr := f.WriteString(clusterDir + "\n")
		f.Close()
		if werr != nil {
			return "", "", fmt.Errorf("lease pod subnet: %w", werr)
		}
		return fmt.Sprintf("10.244.%d.0/24", n), lease, nil
	}
	return "", "", errors.New("no free pod subnet in 10.244.0.0/16")
}

// KubefillBinary is the kubefill binary of this checkout that Kubefill's
// host-side processes run, or "" when it could not be built.
func (c *Cluster) KubefillBinary() string { return c.kubefillBin }

// PodLogs returns what a pod's container printed in its latest run, from
// kubelet through the API.
func (c *Cluster) PodLogs(ctx context.Context, ns, pod, container string) (string, error) {
	data, err := c.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("logs of %s/%s %s: %w", ns, pod, container, err)
	}
	return string(data), nil
}
