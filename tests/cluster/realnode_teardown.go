package cluster

import (
	"bytes"
	"context"
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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The real node leaves traces outside the cluster directory; teardown
// removes each of them and Leftovers checks for each:
//   - pod sandboxes: removed through CRI before containerd stops, which
//     runs CNI DEL (the pods' veths and /var/run/netns/cni-* go with it);
//   - containerd's shims, which outlive containerd;
//   - /var/lib/cni entries of our network;
//   - the cgroups under our cgroupRoot in every hierarchy;
//   - kube-proxy's and kubelet's iptables chains (kube-proxy --cleanup, then
//     kubelet's KUBE-* chains) and our guard chain;
//   - ip_forward, restored to what it was;
//   - the machine-wide real-node lease.

// removeSandboxes stops and removes every pod sandbox containerd runs for
// this node. It is best effort: containerd may already be gone.
func removeSandboxes(socket string) []error {
	if _, err := os.Stat(socket); err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return []error{fmt.Errorf("dial containerd's CRI: %w", err)}
	}
	defer conn.Close()
	rt := criv1.NewRuntimeServiceClient(conn)
	list, err := rt.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{})
	if err != nil {
		return []error{fmt.Errorf("list pod sandboxes: %w", err)}
	}
	var errs []error
	for _, sb := range list.Items {
		if _, err := rt.StopPodSandbox(ctx, &criv1.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stop pod sandbox %s (%s/%s): %w", sb.Id, sb.Metadata.GetNamespace(), sb.Metadata.GetName(), err))
			continue
		}
		if _, err := rt.RemovePodSandbox(ctx, &criv1.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("remove pod sandbox %s: %w", sb.Id, err))
		}
	}
	return errs
}

// shimProcesses finds the containerd shims serving our containerd: they
// are started with "-address <socket>".
func shimProcesses(socket string) []int {
	if socket == "" {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if len(args) == 0 || !strings.HasSuffix(args[0], "containerd-shim-runc-v2") {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == socket {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// killShims ends our shims (and the containers under them) that survived.
func killShims(socket string) []error {
	pids := shimProcesses(socket)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(shimProcesses(socket)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := shimProcesses(socket); len(left) > 0 {
		return []error{fmt.Errorf("containerd shims %v still run", left)}
	}
	return nil
}

// cgroupDirs lists our cgroupRoot in every mounted v1 hierarchy.
func cgroupDirs(root string) []string {
	if root == "" {
		return nil
	}
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	var dirs []string
	for _, h := range hierarchies {
		d := filepath.Join(h, root)
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// removeCgroups removes our cgroup trees, deepest first (cgroup directories
// are removed with rmdir, and only once empty).
func removeCgroups(root string) []error {
	var errs []error
	for _, top := range cgroupDirs(root) {
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for i := 0; i < 20; i++ {
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond) // a process may still be leaving it
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
			}
		}
	}
	return errs
}

// cniCacheEntries lists /var/lib/cni files that name our network.
func cniCacheEntries(network string) []string {
	if network == "" {
		return nil
	}
	var out []string
	_ = filepath.WalkDir("/var/lib/cni", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), network+"-") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// xtables are the commands of the two address families: kubelet makes
// its canary and firewall chains in both.
var xtables = []string{"iptables", "ip6tables"}

// kubeChains lists the KUBE-* chains in the iptables and ip6tables tables
// kube-proxy and kubelet write.
func kubeChains() []string {
	var out []string
	for _, cmd := range xtables {
		for _, table := range []string{"filter", "nat", "mangle"} {
			b, err := exec.Command(cmd, "-w", "-t", table, "-S").Output()
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				if f := strings.Fields(line); len(f) == 2 && f[0] == "-N" && strings.HasPrefix(f[1], "KUBE-") {
					out = append(out, cmd+" "+table+"/"+f[1])
				}
			}
		}
	}
	return out
}

// removeKubeChains empties and deletes the KUBE-* chains kubelet leaves
// (kube-proxy --cleanup removes its own), after dropping every jump to
// them, in both address families.
func removeKubeChains() []error {
	var errs []error
	for _, cmd := range xtables {
		run := func(args ...string) error {
			out, err := exec.Command(cmd, append([]string{"-w"}, args...)...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s %s: %v: %s", cmd, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
			}
			return nil
		}
		for _, table := range []string{"filter", "nat", "mangle"} {
			b, err := exec.Command(cmd, "-w", "-t", table, "-S").Output()
			if err != nil {
				continue
			}
			var chains []string
			for _, line := range strings.Split(string(b), "\n") {
				f := strings.Fields(line)
				if len(f) == 2 && f[0] == "-N" && strings.HasPrefix(f[1], "KUBE-") {
					chains = append(chains, f[1])
				}
				// A rule jumping to a KUBE- chain from a built-in chain.
				if len(f) > 3 && f[0] == "-A" && !strings.HasPrefix(f[1], "KUBE-") && bytes.Contains([]byte(line), []byte("-j KUBE-")) {
					if err := run(append([]string{"-t", table, "-D"}, f[1:]...)...); err != nil {
						errs = append(errs, err)
					}
				}
			}
			for _, ch := range chains {
				_ = run("-t", table, "-F", ch)
			}
			for _, ch := range chains {
				if err := run("-t", table, "-X", ch); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errs
}

// tearDownRealNode removes what the real node left outside the cluster
// directory once its processes are gone (containerd's sandboxes were
// removed before it stopped).
func tearDownRealNode(rn *realNode) []error {
	var errs []error
	errs = append(errs, killShims(rn.ContainerdSocket)...)
	if rn.KubeProxy != "" {
		if out, err := exec.Command(rn.KubeProxy, "--cleanup").CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("kube-proxy --cleanup: %v: %s", err, tail(string(out), 5)))
		}
	}
	errs = append(errs, removeKubeChains()...)
	for _, f := range cniCacheEntries(rn.CNINetwork) {
		if err := os.Remove(f); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, removeCgroups(rn.CgroupRoot)...)
	if rn.Net != nil {
		errs = append(errs, rn.Net.tearDown()...)
	}
	return errs
}

// releaseRealNode gives up the machine-wide lease if this cluster holds it.
func releaseRealNode(dir string, rn *realNode) error {
	owner, err := os.ReadFile(rn.Lease)
	if err != nil {
		return nil
	}
	if strings.TrimSpace(string(owner)) != dir {
		return nil
	}
	if err := os.Remove(rn.Lease); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("release the real node: %w", err)
	}
	return nil
}

// realNodeLeftovers lists the real node's traces that still exist.
func realNodeLeftovers(dir string, rn *realNode) []string {
	var out []string
	for _, pid := range shimProcesses(rn.ContainerdSocket) {
		out = append(out, fmt.Sprintf("containerd shim (pid %d)", pid))
	}
	for _, f := range cniCacheEntries(rn.CNINetwork) {
		out = append(out, "CNI cache "+f)
	}
	for _, d := range cgroupDirs(rn.CgroupRoot) {
		out = append(out, "cgroup "+d)
	}
	for _, ch := range kubeChains() {
		out = append(out, "chain "+ch)
	}
	if rn.Net != nil {
		out = append(out, rn.Net.leftovers()...)
		if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err == nil && rn.Net.IPForward != "" && strings.TrimSpace(string(b)) != rn.Net.IPForward {
			out = append(out, "ip_forward "+strings.TrimSpace(string(b))+", was "+rn.Net.IPForward)
		}
	}
	if owner, err := os.ReadFile(rn.Lease); err == nil && strings.TrimSpace(string(owner)) == dir {
		out = append(out, "real-node lease "+rn.Lease)
	}
	return out
}

// loopDevicesUnder lists loop devices whose backing file is below dir (the
// CSI node plugin attaches Block volumes to loop devices).
func loopDevicesUnder(dir string) []string {
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var devs []string
	for _, b := range backing {
		data, err := os.ReadFile(b)
		if err != nil {
			continue
		}
		if f := strings.TrimSpace(string(data)); dir != "" && strings.HasPrefix(f, dir+"/") {
			devs = append(devs, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(b))))
		}
	}
	return devs
}

// detachLoopDevices detaches the loop devices backed by files below dir.
func detachLoopDevices(dir string) []error {
	var errs []error
	for _, dev := range loopDevicesUnder(dir) {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("losetup -d %s: %v: %s", dev, err, strings.TrimSpace(string(out))))
		}
	}
	return errs
}
