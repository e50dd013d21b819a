package cluster

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestRestartAPIServer restarts kube-apiserver of a control plane (no node):
// the API answers again, the record names the new process, and Stop leaves
// neither the old nor the new one behind.
func TestRestartAPIServer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root like the rest of the local cluster")
	}
	c, err := Start(context.Background(), Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if _, err := c.Restart(ctx, "no-such-component", 0); err == nil || !strings.Contains(err.Error(), "did not start") {
		t.Errorf("restarting an unknown component: %v", err)
	}
	var old procRecord
	for _, p := range c.State().Processes {
		if p.Name == "kube-apiserver" {
			old = p
		}
	}
	r, err := c.Restart(ctx, "kube-apiserver", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.OldPID != old.PID || r.NewPID == old.PID || old.alive() {
		t.Errorf("old pid %d (alive %v), restart says %d -> %d", old.PID, old.alive(), r.OldPID, r.NewPID)
	}
	if r.Down < time.Second {
		t.Errorf("down only %s, asked for 1s", r.Down)
	}
	if _, err := c.Client.Discovery().ServerVersion(); err != nil {
		t.Errorf("API after the restart: %v", err)
	}
	saved, err := LoadState(c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var recorded []int
	for _, p := range saved.Processes {
		if p.Name == "kube-apiserver" {
			recorded = append(recorded, p.PID)
		}
	}
	if len(recorded) != 1 || recorded[0] != r.NewPID {
		t.Errorf("state records kube-apiserver pids %v, want just %d", recorded, r.NewPID)
	}
	state := c.State()
	stopped = true
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if left := state.Leftovers(); len(left) > 0 {
		t.Errorf("left behind after Stop: %v", left)
	}
}
