package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// KillContainer sends signal (a name ctr knows, e.g. SIGKILL) to the main
// process of a container on the real node, through containerd as `ctr -n
// k8s.io task kill -s SIGKILL <id>` does, and waits until that process is
// gone. containerID is a pod status's containerID (containerd://<id>) or
// the bare id. It returns the host PID of the process it signalled; the
// container is then kubelet's to restart, as after any crash.
func (c *Cluster) KillContainer(ctx context.Context, containerID, signal string) (int, error) {
	if c.state.Node == nil {
		return 0, errors.New("kill container: the cluster has no real node")
	}
	id := strings.TrimPrefix(containerID, "containerd://")
	if id == "" || strings.Contains(id, "://") {
		return 0, fmt.Errorf("kill container: %q is not a containerd container ID", containerID)
	}
	pid, err := c.taskPID(ctx, id)
	if err != nil {
		return 0, err
	}
	// Its start time tells it from a later process given the same PID.
	start, err := processStartTime(pid)
	if err != nil {
		return pid, fmt.Errorf("kill container %s: process %d: %w", id, pid, err)
	}
	proc := procRecord{Name: "container " + id, PID: pid, StartTime: start}
	if _, err := c.ctr(ctx, "task", "kill", "--signal", signal, id); err != nil {
		return pid, fmt.Errorf("kill container %s: %w", id, err)
	}
	// The shim reaps it at once; a zombie counts as gone (it runs no more).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if !proc.alive() {
			return pid, nil
		}
		if time.Now().After(deadline) {
			return pid, fmt.Errorf("kill container %s: process %d still runs 10 s after %s", id, pid, signal)
		}
	}
}

// taskPID is the host PID of a running container's main process, from
// `ctr task ls` (TASK PID STATUS).
func (c *Cluster) taskPID(ctx context.Context, id string) (int, error) {
	out, err := c.ctr(ctx, "task", "ls")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != id {
			continue
		}
		if f[2] != "RUNNING" {
			return 0, fmt.Errorf("container %s's task is %s, not RUNNING", id, f[2])
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil {
			return 0, fmt.Errorf("container %s: PID %q in ctr task ls: %w", id, f[1], err)
		}
		return pid, nil
	}
	return 0, fmt.Errorf("container %s has no task on the node", id)
}
