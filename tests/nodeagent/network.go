package nodeagent

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
)

// podNetwork hands out pod addresses from a private /24 the agent owns and
// wires each pod's network namespace to the host with a veth pair:
//
//	host:  <prefix><id> with the gateway address (.1/32), a /32 route to the pod,
//	       forwarding enabled on that link only
//	pod:   eth0 with the pod address (/32), a link route to the gateway and a
//	       route to the pod subnet through it; no default route
//
// So pods reach the host's processes (at the gateway address) and each other,
// the host reaches every pod, and nothing is routed off the machine.
type podNetwork struct {
	prefix  string
	subnet  netip.Prefix
	gateway netip.Addr

	mu   sync.Mutex
	used map[netip.Addr]string
}

func newPodNetwork(prefix, subnet string) (*podNetwork, error) {
	p, err := netip.ParsePrefix(subnet)
	if err != nil {
		return nil, fmt.Errorf("pod subnet %q: %w", subnet, err)
	}
	if !p.Addr().Is4() || p.Bits() > 28 {
		return nil, fmt.Errorf("pod subnet %q: want an IPv4 prefix of /28 or larger", subnet)
	}
	if !p.Addr().IsPrivate() {
		return nil, fmt.Errorf("pod subnet %q is not a private range", subnet)
	}
	p = p.Masked()
	if len(prefix) > 6 {
		return nil, fmt.Errorf("link prefix %q longer than 6 characters", prefix)
	}
	return &podNetwork{prefix: prefix, subnet: p, gateway: p.Addr().Next(), used: map[netip.Addr]string{}}, nil
}

// names derives the namespace and host link name of a pod (15 characters at
// most, as link names must be).
func (n *podNetwork) names(uid string) string {
	id := strings.ReplaceAll(uid, "-", "")
	if len(id) > 8 {
		id = id[:8]
	}
	return n.prefix + id
}

// fence installs an unreachable route for the whole pod subnet, so that
// traffic for an address no pod holds fails on the host instead of following
// the default route off the machine. The pods' /32 routes are more specific.
// It also puts the gateway address on a link of the host's own, so that host
// processes can listen there before any pod exists (kube-apiserver reaches
// aggregated API servers on the host that way; it refuses loopback endpoints).
func (n *podNetwork) fence() error {
	if err := ip("route", "replace", "unreachable", n.subnet.String()); err != nil {
		return err
	}
	// A veth pair with both ends on the host: some kernels lack dummy links.
	link, peer := n.gatewayLink(), n.prefix+"gp"
	if err := ip("link", "add", link, "type", "veth", "peer", "name", peer); err != nil && !strings.Contains(err.Error(), "File exists") {
		return err
	}
	if err := ip("addr", "replace", n.gateway.String()+"/32", "dev", link); err != nil {
		return err
	}
	if err := ip("link", "set", peer, "up"); err != nil {
		return err
	}
	return ip("link", "set", link, "up")
}

// gatewayLink names the link holding the gateway address; the prefix is the
// cluster's, so teardown removes it with the pods' links.
func (n *podNetwork) gatewayLink() string { return n.prefix + "gw" }

// unfence removes the route and the gateway's link.
func (n *podNetwork) unfence() error {
	var errs []error
	if err := ip("route", "del", "unreachable", n.subnet.String()); err != nil && !strings.Contains(err.Error(), "No such process") {
		errs = append(errs, err)
	}
	if err := ip("link", "del", n.gatewayLink()); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (n *podNetwork) allocate(owner string) (netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for a := n.gateway.Next(); n.subnet.Contains(a); a = a.Next() {
		if !n.subnet.Contains(a.Next()) {
			break // keep the broadcast address free
		}
		if _, taken := n.used[a]; !taken {
			n.used[a] = owner
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("pod subnet %s is exhausted", n.subnet)
}

func (n *podNetwork) release(a netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.used, a)
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setup creates the pod's namespace and veth and returns the pod address.
// On error it removes what it made.
func (n *podNetwork) setup(uid string) (ns string, addr netip.Addr, err error) {
	ns = n.names(uid)
	addr, err = n.allocate(uid)
	if err != nil {
		return "", netip.Addr{}, err
	}
	defer func() {
		if err != nil {
			n.teardown(ns, addr)
		}
	}()
	pod := addr.String()
	gw := n.gateway.String()
	steps := [][]string{
		{"netns", "add", ns},
		{"link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "addr", "add", pod + "/32", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "route", "add", gw, "dev", "eth0", "scope", "link"},
		{"-n", ns, "route", "add", n.subnet.String(), "via", gw, "dev", "eth0", "src", pod},
		{"addr", "add", gw + "/32", "dev", ns},
		{"link", "set", ns, "up"},
		{"route", "add", pod + "/32", "dev", ns, "src", gw},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return "", netip.Addr{}, err
		}
	}
	// Forward between pods on this link only; the host's uplink keeps its
	// own setting and pods have no route out anyway.
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+ns+"/forwarding", []byte("1"), 0o644); err != nil {
		return "", netip.Addr{}, fmt.Errorf("enable forwarding on %s: %w", ns, err)
	}
	return ns, addr, nil
}

// teardown kills what runs in the namespace and removes it and the veth.
func (n *podNetwork) teardown(ns string, addr netip.Addr) error {
	var errs []string
	if _, err := os.Stat("/run/netns/" + ns); err == nil {
		if out, _ := exec.Command("ip", "netns", "pids", ns).Output(); len(strings.TrimSpace(string(out))) > 0 {
			for _, p := range strings.Fields(string(out)) {
				_ = exec.Command("kill", "-9", p).Run()
			}
		}
		if err := ip("netns", "delete", ns); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if _, err := os.Stat("/sys/class/net/" + ns); err == nil {
		if err := ip("link", "delete", ns); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
			errs = append(errs, err.Error())
		}
	}
	if addr.IsValid() {
		n.release(addr)
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove pod network %s: %s", ns, strings.Join(errs, "; "))
	}
	return nil
}
