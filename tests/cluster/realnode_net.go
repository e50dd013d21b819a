package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// The real node's addresses. A cluster leases n (see leasePodSubnet) and
// takes 10.244.n.0/24 for pods and 10.249.n.1 for the node. The Service
// range is fixed: only one real node runs on a machine at a time (its
// kubelet owns host-wide paths), see leaseRealNode.
const (
	podRange      = "10.244.0.0/16"
	nodeRange     = "10.249.0.0/16"
	kubeDNSIP     = "10.96.0.10"
	kubernetesSvc = "10.96.0.1"
)

// guardedRanges are the address ranges that must never leave the machine:
// pods, Services and node addresses.
var guardedRanges = []string{podRange, serviceClusterIPRange, nodeRange}

// nodeNetwork is the real node's share of the host network, all of it named
// after the cluster's prefix so that teardown finds it.
type nodeNetwork struct {
	NodeIP     string `json:"nodeIP"`
	PodSubnet  string `json:"podSubnet"`
	PodGateway string `json:"podGateway"`
	// NodeLink is a bridge of our own holding the node address: kubelet
	// refuses a loopback node IP and pods cannot reach 127.0.0.1.
	NodeLink string `json:"nodeLink"`
	// CNIBridge is the bridge the CNI bridge plugin makes for pods.
	CNIBridge string `json:"cniBridge"`
	// GuardChain is the mangle chain that drops guarded traffic leaving
	// through any interface but ours.
	GuardChain string `json:"guardChain"`
	// IPForward is net.ipv4.ip_forward before the node changed it.
	IPForward string `json:"ipForward"`
}

func newNodeNetwork(prefix, podSubnet string) (*nodeNetwork, error) {
	parts := strings.Split(strings.TrimSuffix(podSubnet, ".0/24"), ".")
	if len(parts) != 3 {
		return nil, fmt.Errorf("pod subnet %q is not 10.244.<n>.0/24", podSubnet)
	}
	n, err := strconv.Atoi(parts[2])
	if err != nil {
		return nil, fmt.Errorf("pod subnet %q: %w", podSubnet, err)
	}
	return &nodeNetwork{
		NodeIP:     fmt.Sprintf("10.249.%d.1", n),
		PodSubnet:  podSubnet,
		PodGateway: fmt.Sprintf("10.244.%d.1", n),
		NodeLink:   prefix + "node",
		CNIBridge:  prefix + "cni",
		GuardChain: "KUBEFILL-GUARD-" + prefix,
	}, nil
}

// setUp makes the node link, routes the Service range through it (so that
// host-to-Service traffic never picks the default route), installs the
// guard and enables forwarding, which pods reaching Services need.
func (n *nodeNetwork) setUp() error {
	if err := ip("link", "add", n.NodeLink, "type", "bridge"); err != nil && !strings.Contains(err.Error(), "File exists") {
		return err
	}
	if err := ip("addr", "replace", n.NodeIP+"/32", "dev", n.NodeLink); err != nil {
		return err
	}
	if err := ip("link", "set", n.NodeLink, "up"); err != nil {
		return err
	}
	if err := ip("route", "replace", serviceClusterIPRange, "dev", n.NodeLink, "src", n.NodeIP); err != nil {
		return err
	}
	if err := n.installGuard(); err != nil {
		return err
	}
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		return fmt.Errorf("read ip_forward: %w", err)
	}
	n.IPForward = strings.TrimSpace(string(fwd))
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable ip_forward: %w", err)
	}
	return nil
}

// linkNamespace starts the name of every link a local cluster makes (its
// prefix is "kf" and four hex digits).
const linkNamespace = "kf"

// installGuard adds, at the end of mangle POSTROUTING (after every NAT
// decision, when the outgoing interface is final), a chain that lets
// traffic through loopback and the cluster's own links and drops anything
// else from or to the pod, Service and node ranges.
func (n *nodeNetwork) installGuard() error {
	if err := iptables("-t", "mangle", "-N", n.GuardChain); err != nil && !strings.Contains(err.Error(), "exists") {
		return err
	}
	if err := iptables("-t", "mangle", "-F", n.GuardChain); err != nil {
		return err
	}
	// Every link the harness makes is named kf<prefix>...: other local
	// clusters' links are ours too.
	rules := [][]string{{"-o", "lo", "-j", "RETURN"}, {"-o", linkNamespace + "+", "-j", "RETURN"}}
	for _, r := range guardedRanges {
		rules = append(rules, []string{"-s", r, "-j", "DROP"}, []string{"-d", r, "-j", "DROP"})
	}
	for _, r := range rules {
		if err := iptables(append([]string{"-t", "mangle", "-A", n.GuardChain}, r...)...); err != nil {
			return err
		}
	}
	if iptables("-t", "mangle", "-C", "POSTROUTING", "-j", n.GuardChain) == nil {
		return nil
	}
	return iptables("-t", "mangle", "-A", "POSTROUTING", "-j", n.GuardChain)
}

// GuardDrops returns how many packets the guard has dropped, and an error
// when the guard is not installed in POSTROUTING.
func GuardDrops(chain string) (uint64, error) {
	if err := iptables("-t", "mangle", "-C", "POSTROUTING", "-j", chain); err != nil {
		return 0, fmt.Errorf("guard %s is not in mangle POSTROUTING: %w", chain, err)
	}
	out, err := exec.Command("iptables", "-t", "mangle", "-L", chain, "-n", "-v", "-x").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("list guard %s: %v: %s", chain, err, out)
	}
	var drops uint64
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[2] == "DROP" {
			v, _ := strconv.ParseUint(f[0], 10, 64)
			drops += v
		}
	}
	return drops, nil
}

// tearDown removes the guard and the node link and restores ip_forward.
// The CNI bridge goes with the cluster's other links (removeNetwork).
func (n *nodeNetwork) tearDown() []error {
	var errs []error
	for iptables("-t", "mangle", "-C", "POSTROUTING", "-j", n.GuardChain) == nil {
		if err := iptables("-t", "mangle", "-D", "POSTROUTING", "-j", n.GuardChain); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if iptables("-t", "mangle", "-L", n.GuardChain, "-n") == nil {
		if err := iptables("-t", "mangle", "-F", n.GuardChain); err != nil {
			errs = append(errs, err)
		}
		if err := iptables("-t", "mangle", "-X", n.GuardChain); err != nil {
			errs = append(errs, err)
		}
	}
	if err := ip("link", "del", n.NodeLink); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
		errs = append(errs, err)
	}
	if n.IPForward != "" {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte(n.IPForward), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore ip_forward: %w", err))
		}
	}
	return errs
}

// leftovers lists what of the node network still exists.
func (n *nodeNetwork) leftovers() []string {
	var out []string
	if iptables("-t", "mangle", "-L", n.GuardChain, "-n") == nil {
		out = append(out, "iptables chain mangle/"+n.GuardChain)
	}
	return out
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func iptables(args ...string) error {
	out, err := exec.Command("iptables", append([]string{"-w"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// realNodeLease is the host-wide claim on the one real node a machine can
// run: kubelets share /var/lib/cni, the shim socket directory and the
// cgroup tree, so two would trip over each other.
const realNodeLease = "/run/kubefill/real-node"

// leaseRealNode records clusterDir as the machine's real node, or says
// which cluster holds it. A lease whose cluster directory has no state any
// more is stale and taken over.
func leaseRealNode(clusterDir string) error {
	if err := os.MkdirAll(filepath.Dir(realNodeLease), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(realNodeLease), err)
	}
	for attempt := 0; attempt < 2; attempt++ {
		f, err := os.OpenFile(realNodeLease, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if errors.Is(err, os.ErrExist) {
			owner, rerr := os.ReadFile(realNodeLease)
			holder := strings.TrimSpace(string(owner))
			if rerr == nil {
				if _, serr := os.Stat(filepath.Join(holder, stateFile)); errors.Is(serr, os.ErrNotExist) {
					_ = os.Remove(realNodeLease)
					continue
				}
			}
			return fmt.Errorf("the cluster in %s runs this machine's real node; stop it first (kubefill-dev down --dir %s)", holder, holder)
		}
		if err != nil {
			return fmt.Errorf("lease the real node: %w", err)
		}
		_, werr := f.WriteString(clusterDir + "\n")
		f.Close()
		return werr
	}
	return errors.New("lease the real node: lost a race for a stale lease")
}
