package cluster

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// startCSINodePlugin runs the hostpath driver's node side as a privileged
// DaemonSet pod on the real node and waits until kubelet has registered it
// (the CSINode lists the driver).
func (c *Cluster) startCSINodePlugin(ctx context.Context) error {
	t0 := time.Now()
	ds := CSINodePluginDaemonSet(CSINodePluginParams{
		Image:       DevImage,
		DriverName:  DriverName,
		NodeName:    c.NodeName,
		KubeletRoot: c.KubeletRoot(),
		DataDir:     c.CSIDataDir(),
	})
	if _, err := c.Client.AppsV1().DaemonSets(ds.Namespace).Create(ctx, ds, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the CSI node plugin DaemonSet: %w", err)
	}
	var rec procRecord
	for _, p := range c.state.Processes {
		if p.Name == "kubelet" {
			rec = p
		}
	}
	err := waitReady(ctx, rec, 2*componentStartupTimeout, 100*time.Millisecond, "the CSI node plugin never registered with kubelet", func(ctx context.Context) (bool, string) {
		csiNode, err := c.Client.StorageV1().CSINodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, "CSINode: " + err.Error()
		}
		for _, d := range csiNode.Spec.Drivers {
			if d.Name == DriverName {
				return true, ""
			}
		}
		return false, c.describeDaemonSetPods(ctx, ds.Namespace, ds.Spec.Selector.MatchLabels)
	})
	if err != nil {
		return err
	}
	c.opts.Logf("cluster: CSI node plugin registered (%s)", time.Since(t0).Round(time.Millisecond))
	return nil
}

// describeDaemonSetPods says what the pods matching labels are doing, for
// errors.
func (c *Cluster) describeDaemonSetPods(ctx context.Context, ns string, labels map[string]string) string {
	sel := metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: labels})
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return err.Error()
	}
	if len(pods.Items) == 0 {
		return "no node plugin pod yet"
	}
	p := pods.Items[0]
	msg := fmt.Sprintf("pod %s %s", p.Name, p.Status.Phase)
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			msg += fmt.Sprintf(", %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
		case cs.State.Terminated != nil:
			msg += fmt.Sprintf(", %s terminated: %s %s", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.Message)
		}
	}
	return msg
}
