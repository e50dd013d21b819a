package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// launch is how the harness started a component: Restart starts it again
// the same way.
type launch struct {
	env  []string
	bin  string
	args []string
}

// Restarted says what a restart did and how long each part took.
type Restarted struct {
	Name   string
	OldPID int
	NewPID int
	// Stopping is how long the old process took to exit after SIGTERM.
	Stopping time.Duration
	// Down is from the stop signal until the new process started.
	Down time.Duration
	// Recovery is from the new process's start until it was healthy.
	Recovery time.Duration
}

func (r Restarted) String() string {
	return fmt.Sprintf("%s restarted (pid %d -> %d): stopped in %s, down %s, healthy %s after its start",
		r.Name, r.OldPID, r.NewPID, r.Stopping.Round(time.Millisecond), r.Down.Round(time.Millisecond), r.Recovery.Round(time.Millisecond))
}

// restartStopGrace is how long a component may take to exit on SIGTERM
// before it gets SIGKILL. kubelet and containerd exit in well under a
// second; kube-apiserver stops listening at once but then waits for its
// clients' open connections (seen: still there 15 s later with
// kube-controller-manager connected), so it ends by SIGKILL after this grace.
const restartStopGrace = 5 * time.Second

// Restart stops a component the harness started ("kubelet", "containerd",
// "kube-apiserver", or any other process it records), keeps it down for
// down, starts it again with the same binary, arguments and environment
// (its output goes on in the same log) and waits until it is healthy again:
// kube-apiserver ready, containerd serving and the node Ready, kubelet
// renewing its node lease with the node Ready and the CSI node plugin
// registered with it again. The process record is replaced in place, so
// Stop and State.Leftovers see the new process.
//
// Containerd's shims outlive containerd, so the pods' containers keep
// running through a containerd restart; kubelet's restart leaves them
// running too.
func (c *Cluster) Restart(ctx context.Context, name string, down time.Duration) (Restarted, error) {
	r := Restarted{Name: name}
	idx := -1
	for i, p := range c.state.Processes {
		if p.Name == name {
			idx = i
		}
	}
	l, ok := c.launches[name]
	if idx < 0 || !ok {
		return r, fmt.Errorf("restart %s: the cluster did not start such a component", name)
	}
	old := c.state.Processes[idx]
	if !old.alive() {
		return r, fmt.Errorf("restart %s: pid %d is not running:\n%s", name, old.PID, logTail(old.LogFile, 20))
	}
	r.OldPID = old.PID
	stopAt := time.Now()
	if err := old.stop(restartStopGrace); err != nil {
		return r, fmt.Errorf("restart %s: %w", name, err)
	}
	r.Stopping = time.Since(stopAt)
	select {
	case <-ctx.Done():
		return r, fmt.Errorf("restart %s: %w (left stopped)", name, ctx.Err())
	case <-time.After(down - r.Stopping):
	}
	logOffset := fileSize(old.LogFile)
	rec, err := startProcess(c.Dir, name, c.opts.Detach, l.env, l.bin, l.args...)
	if err != nil {
		return r, fmt.Errorf("restart %s: %w", name, err)
	}
	startedAt := time.Now()
	r.Down = startedAt.Sub(stopAt)
	r.NewPID = rec.PID
	c.state.Processes[idx] = rec
	if err := c.state.save(); err != nil {
		return r, err
	}
	if err := c.waitHealthy(ctx, rec, startedAt, logOffset); err != nil {
		return r, fmt.Errorf("restart %s: %w", name, err)
	}
	r.Recovery = time.Since(startedAt)
	c.opts.Logf("cluster: %s", r)
	return r, nil
}

// waitHealthy waits until a component started at startedAt works again.
func (c *Cluster) waitHealthy(ctx context.Context, rec procRecord, startedAt time.Time, logOffset int64) error {
	switch rec.Name {
	case "kube-apiserver":
		return c.waitAPIReady(ctx, rec)
	case "containerd":
		if err := waitReady(ctx, rec, componentStartupTimeout, 50*time.Millisecond, "containerd not serving", func(ctx context.Context) (bool, string) {
			out, err := c.ctr(ctx, "version")
			return err == nil, out
		}); err != nil {
			return err
		}
		return c.waitNodeReady(ctx)
	case "kubelet":
		if err := c.waitKubeletBack(ctx, rec, startedAt); err != nil {
			return err
		}
		if err := c.waitNodeReady(ctx); err != nil {
			return err
		}
		if !c.opts.Storage {
			return nil
		}
		// A new kubelet knows no CSI driver until its plugin watcher finds
		// the registration socket again; until then it cannot mount or
		// unmount CSI volumes.
		want := "Register new plugin with name: " + DriverName
		return waitReady(ctx, rec, componentStartupTimeout, 100*time.Millisecond, "kubelet never registered the CSI node plugin again", func(context.Context) (bool, string) {
			return strings.Contains(readFrom(rec.LogFile, logOffset), want), "no " + strings.TrimSpace(want) + " in its log yet"
		})
	default:
		// Nothing to ask it: it must at least stay up for a moment.
		time.Sleep(time.Second)
		if !rec.alive() {
			return fmt.Errorf("%s exited:\n%s", rec.Name, logTail(rec.LogFile, 30))
		}
		return nil
	}
}

// waitKubeletBack waits until the new kubelet has renewed its node's lease,
// which says it talks to kube-apiserver (the node may have stayed Ready
// through a short restart, so Ready alone says nothing).
func (c *Cluster) waitKubeletBack(ctx context.Context, rec procRecord, startedAt time.Time) error {
	return waitReady(ctx, rec, componentStartupTimeout, 100*time.Millisecond, "the restarted kubelet never renewed its node lease", func(ctx context.Context) (bool, string) {
		lease, err := c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if lease.Spec.RenewTime == nil || !lease.Spec.RenewTime.After(startedAt) {
			return false, fmt.Sprintf("lease renewed at %v, kubelet started at %v", lease.Spec.RenewTime, startedAt.Format(time.RFC3339Nano))
		}
		return true, ""
	})
}

// RestartCSINodePlugin deletes the CSI node plugin's pod and waits until the
// DaemonSet's new pod is Ready and kubelet lists the driver on the node
// again. It returns the time that took.
func (c *Cluster) RestartCSINodePlugin(ctx context.Context) (time.Duration, error) {
	const ns = "kube-system"
	sel := metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": CSINodePluginName}})
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return 0, fmt.Errorf("list the CSI node plugin's pods: %w", err)
	}
	if len(pods.Items) == 0 {
		return 0, errors.New("no CSI node plugin pod runs")
	}
	var kubelet procRecord
	for _, p := range c.state.Processes {
		if p.Name == "kubelet" {
			kubelet = p
		}
	}
	logOffset := fileSize(kubelet.LogFile)
	start := time.Now()
	old := map[string]bool{}
	for _, p := range pods.Items {
		old[string(p.UID)] = true
		if err := c.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			return 0, fmt.Errorf("delete the CSI node plugin pod %s: %w", p.Name, err)
		}
	}
	err = waitReady(ctx, kubelet, 2*componentStartupTimeout, 200*time.Millisecond, "the CSI node plugin did not come back", func(ctx context.Context) (bool, string) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return false, err.Error()
		}
		var ready bool
		for _, p := range pods.Items {
			if old[string(p.UID)] {
				return false, "the old pod " + p.Name + " is still there"
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					ready = true
				}
			}
		}
		if !ready {
			return false, c.describeDaemonSetPods(ctx, ns, map[string]string{"app.kubernetes.io/name": CSINodePluginName})
		}
		csiNode, err := c.Client.StorageV1().CSINodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, "CSINode: " + err.Error()
		}
		listed := false
		for _, d := range csiNode.Spec.Drivers {
			listed = listed || d.Name == DriverName
		}
		if !listed {
			return false, "the CSINode does not list " + DriverName + " yet"
		}
		// The CSINode may still list the driver from before; kubelet
		// says when it registered the new plugin.
		if !strings.Contains(readFrom(kubelet.LogFile, logOffset), "Register new plugin with name: "+DriverName) {
			return false, "kubelet has not registered the new plugin yet"
		}
		return true, ""
	})
	if err != nil {
		return 0, err
	}
	took := time.Since(start)
	c.opts.Logf("cluster: CSI node plugin restarted and registered again in %s", took.Round(time.Millisecond))
	return took, nil
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// readFrom returns a file's contents from offset on ("" on error).
func readFrom(path string, offset int64) string {
	data, err := os.ReadFile(path)
	if err != nil || int64(len(data)) < offset {
		return ""
	}
	return string(data[offset:])
}
