package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kubefill/kubefill/tests/internal/mountinfo"
)

// stateFile is the record of everything a cluster made, kept in its directory
// so that Stop, `kubefill-dev down` and a later run after a crash can all
// remove it.
const stateFile = "state.json"

// State is what a cluster wrote down about itself.
type State struct {
	Dir        string       `json:"dir"`
	NetPrefix  string       `json:"netPrefix"`
	PodSubnet  string       `json:"podSubnet"`
	SubnetLock string       `json:"subnetLock"`
	Kubeconfig string       `json:"kubeconfig"`
	Processes  []procRecord `json:"processes"`
	// Node is the real node, when the cluster runs one.
	Node *realNode `json:"node,omitempty"`
}

func (s *State) save() error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("marshal cluster state: %w", err)
	}
	tmp := filepath.Join(s.Dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write cluster state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(s.Dir, stateFile)); err != nil {
		return fmt.Errorf("write cluster state: %w", err)
	}
	return nil
}

// LoadState reads the state a cluster left in dir.
func LoadState(dir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, fmt.Errorf("read cluster state in %s: %w", dir, err)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("parse cluster state in %s: %w", dir, err)
	}
	return &s, nil
}

// Teardown removes everything the cluster recorded in dir: its processes
// (and every process left in its pods' network namespaces), its mounts, its
// network namespaces and veths, its subnet lease and, with removeDir, the
// directory itself. It goes on after errors and returns them all joined.
func Teardown(dir string, removeDir bool) error {
	s, err := LoadState(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if removeDir {
				return removeTree(dir)
			}
			return nil
		}
		return err
	}
	var errs []error
	// In reverse start order: Kubefill, the node, storage, the control plane.
	for i := len(s.Processes) - 1; i >= 0; i-- {
		// The pods go before containerd does: removing a sandbox runs CNI
		// DEL and removes its network namespace.
		if s.Processes[i].Name == "containerd" && s.Node != nil {
			errs = append(errs, removeSandboxes(s.Node.ContainerdSocket)...)
		}
		if err := s.Processes[i].stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if s.Node != nil {
		errs = append(errs, tearDownRealNode(s.Node)...)
	}
	if s.NetPrefix != "" {
		errs = append(errs, removeNetwork(s.NetPrefix)...)
	}
	if err := unmountUnder(dir); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, detachLoopDevices(s.Dir)...)
	if s.SubnetLock != "" {
		if err := os.Remove(s.SubnetLock); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("release pod subnet: %w", err))
		}
	}
	if s.Node != nil {
		if err := releaseRealNode(s.Dir, s.Node); err != nil {
			errs = append(errs, err)
		}
	}
	if removeDir {
		if err := removeTree(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeNetwork kills what still runs in the network namespaces whose name
// starts with prefix, deletes them and deletes every link whose name starts
// with prefix (the host ends of the pods' veths; deleting one end of a veth
// deletes both, and the /32 routes go with it).
func removeNetwork(prefix string) []error {
	var errs []error
	namespaces, err := listNetns()
	if err != nil {
		errs = append(errs, err)
	}
	for _, ns := range namespaces {
		if !strings.HasPrefix(ns, prefix) {
			continue
		}
		killNetnsProcesses(ns)
		if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns delete %s: %v: %s", ns, err, strings.TrimSpace(string(out))))
		}
	}
	links, err := listLinks()
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		if out, err := exec.Command("ip", "link", "delete", l).CombinedOutput(); err != nil {
			// The peer's deletion may have taken it already.
			if !strings.Contains(string(out), "Cannot find device") {
				errs = append(errs, fmt.Errorf("ip link delete %s: %v: %s", l, err, strings.TrimSpace(string(out))))
			}
		}
	}
	return errs
}

func killNetnsProcesses(ns string) {
	for attempt := 0; attempt < 50; attempt++ {
		out, err := exec.Command("ip", "netns", "pids", ns).Output()
		if err != nil {
			return
		}
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			return
		}
		sig := syscall.SIGTERM
		if attempt > 20 {
			sig = syscall.SIGKILL
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil {
				_ = syscall.Kill(pid, sig)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func listNetns() ([]string, error) {
	entries, err := os.ReadDir("/run/netns")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("list network namespaces: %w", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

func listLinks() ([]string, error) {
	entries, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	all, err := mountinfo.MountPoints()
	if err != nil {
		return nil, err
	}
	var mounts []string
	for _, mp := range all {
		if mp == abs || strings.HasPrefix(mp, abs+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	return mounts, nil
}

// unmountUnder detaches every mount at or below dir.
func unmountUnder(dir string) error {
	var errs []error
	for attempt := 0; attempt < 5; attempt++ {
		mounts, err := mountsUnder(dir)
		if err != nil {
			return err
		}
		if len(mounts) == 0 {
			return nil
		}
		errs = errs[:0]
		for _, m := range mounts {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	return errors.Join(errs...)
}

// removeTree removes dir after making sure nothing is mounted below it, so
// that it never deletes through a bind mount into a volume or the host.
func removeTree(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return err
	}
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	if len(mounts) > 0 {
		return fmt.Errorf("not removing %s: still mounted: %s", dir, strings.Join(mounts, ", "))
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// SweepStale tears down clusters in the temporary directory that a killed
// run left behind: those with a state file whose processes have all exited.
// A cluster another process still runs is left alone.
func SweepStale() error {
	dirs, err := filepath.Glob(filepath.Join(os.TempDir(), "kubefill-cluster-*"))
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		s, err := LoadState(d)
		if err != nil {
			continue
		}
		live := false
		for _, p := range s.Processes {
			if p.alive() {
				live = true
				break
			}
		}
		if live || len(s.Processes) == 0 {
			continue
		}
		if err := Teardown(d, true); err != nil {
			errs = append(errs, fmt.Errorf("sweep %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// HostAddress is the host's address that pods reach: the node's address.
func (s *State) HostAddress() string {
	if s.Node != nil && s.Node.Net != nil {
		return s.Node.Net.NodeIP
	}
	return ""
}

// Running reports whether any process the cluster started still runs.
func (s *State) Running() bool {
	for _, p := range s.Processes {
		if p.alive() {
			return true
		}
	}
	return false
}

// Leftovers lists what the cluster made that still exists: processes,
// network namespaces, links, mounts below its directory, the pod subnet's
// fence route and lease, and the directory. After Stop it should be empty.
func (s *State) Leftovers() []string {
	var out []string
	for _, p := range s.Processes {
		if p.alive() {
			out = append(out, fmt.Sprintf("process %s (pid %d)", p.Name, p.PID))
		}
	}
	if s.NetPrefix != "" {
		namespaces, _ := listNetns()
		for _, ns := range namespaces {
			if strings.HasPrefix(ns, s.NetPrefix) {
				out = append(out, "network namespace "+ns)
			}
		}
		links, _ := listLinks()
		for _, l := range links {
			if strings.HasPrefix(l, s.NetPrefix) {
				out = append(out, "link "+l)
			}
		}
	}
	if mounts, err := mountsUnder(s.Dir); err == nil {
		for _, m := range mounts {
			out = append(out, "mount "+m)
		}
	}
	for _, dev := range loopDevicesUnder(s.Dir) {
		out = append(out, "loop device "+dev)
	}
	if s.SubnetLock != "" {
		if _, err := os.Stat(s.SubnetLock); err == nil {
			out = append(out, "pod subnet lease "+s.SubnetLock)
		}
	}
	if s.Node != nil {
		out = append(out, realNodeLeftovers(s.Dir, s.Node)...)
	}
	return out
}
