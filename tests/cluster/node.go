package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

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

// KubefillBinary is the kubefill binary that pods with kubefill images run,
// or "" when it could not be built.
func (c *Cluster) KubefillBinary() string { return c.kubefillBin }

// PodLogs returns what a pod's container printed in its latest run: from
// kubelet through the API on a real node; the node agent writes each run's
// output to a file.
func (c *Cluster) PodLogs(ctx context.Context, ns, pod, container string) (string, error) {
	if c.state.Node != nil {
		data, err := c.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
		if err != nil {
			return "", fmt.Errorf("logs of %s/%s %s: %w", ns, pod, container, err)
		}
		return string(data), nil
	}
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join(c.Dir, "node", "pods", string(p.UID), "containers", container, "current.log"))
	if err != nil {
		return "", fmt.Errorf("logs of %s/%s %s: %w", ns, pod, container, err)
	}
	return string(data), nil
}

func (c *Cluster) startNodeAgent(ctx context.Context) error {
	logf := c.opts.Logf
	t0 := time.Now()
	subnet, lease, err := leasePodSubnet(c.Dir)
	if err != nil {
		return err
	}
	c.PodSubnet = subnet
	c.state.PodSubnet, c.state.SubnetLock = subnet, lease
	if err := c.state.save(); err != nil {
		return err
	}
	kc, err := c.writeKubeconfig("node", "system:node:"+c.NodeName, "system:nodes")
	if err != nil {
		return err
	}
	rec, err := c.run("node-agent", nil, c.opts.HelperBinary, "node-agent",
		"--node-name="+c.NodeName,
		"--kubeconfig="+kc,
		"--dir="+filepath.Join(c.Dir, "node"),
		"--csi-endpoint="+c.CSISocket(),
		"--driver-name="+DriverName,
		"--pod-subnet="+subnet,
		"--link-prefix="+c.state.NetPrefix,
		"--kubefill-binary="+c.kubefillBin,
	)
	if err != nil {
		return err
	}
	err = waitReady(ctx, rec, componentStartupTimeout, 50*time.Millisecond, "node "+c.NodeName+" never became Ready with its CSINode", func(ctx context.Context) (bool, string) {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := false
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		// The node lifecycle controller removes the not-ready taint.
		for _, t := range node.Spec.Taints {
			if t.Key == "node.kubernetes.io/not-ready" {
				ready = false
			}
		}
		if !ready {
			return false, "node not Ready"
		}
		csiNode, err := c.Client.StorageV1().CSINodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, "CSINode: " + err.Error()
		}
		return len(csiNode.Spec.Drivers) > 0, "CSINode has no drivers"
	})
	if err != nil {
		return err
	}
	logf("cluster: node %s ready, pod subnet %s (%s)", c.NodeName, subnet, time.Since(t0).Round(time.Millisecond))
	return nil
}
