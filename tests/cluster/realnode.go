package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/kubefill/kubefill/tests/kit"
)

// The images the real node runs, all built here by hack/images.sh and
// imported into containerd: nothing is pulled from outside.
const (
	// PauseImage is the sandbox image containerd 2.4 expects.
	PauseImage = "registry.k8s.io/pause:3.10.2"
	// DevImage holds kubefill-dev (the CSI node plugin) and a shell.
	DevImage = "kubefill-test/dev:e2e"
	// ShellImage is the test shell image (Debian's static busybox).
	ShellImage = "busybox:1.36"
)

// imageArchives are hack/images.sh's outputs, imported at node start.
var imageArchives = []string{"pause.oci.tar", "kubefill.oci.tar", "busybox.oci.tar", "kubefill-dev.oci.tar"}

// realNode is what a cluster records about its real node.
type realNode struct {
	Net *nodeNetwork `json:"net"`
	// BinDir holds containerd, its shim, the CNI plugins and CoreDNS
	// (hack/node.sh).
	BinDir string `json:"binDir"`
	// KubeProxy is the kube-proxy binary, for `kube-proxy --cleanup`.
	KubeProxy string `json:"kubeProxy"`
	// ContainerdSocket is containerd's gRPC socket (also CRI's).
	ContainerdSocket string `json:"containerdSocket"`
	// CgroupRoot is the cgroup kubelet puts every pod under, one per
	// cluster so that teardown removes exactly ours.
	CgroupRoot string `json:"cgroupRoot"`
	// CNINetwork names the CNI network (its cache entries in /var/lib/cni).
	CNINetwork string `json:"cniNetwork"`
	// KubeletRoot is kubelet's --root-dir.
	KubeletRoot string `json:"kubeletRoot"`
	// Lease is the machine-wide real-node lease this cluster holds.
	Lease string `json:"lease"`
}

// NodeIP is the real node's address (kube-apiserver listens there too), or
// "" without a real node.
func (c *Cluster) NodeIP() string {
	if c.state.Node == nil {
		return ""
	}
	return c.state.Node.Net.NodeIP
}

// GuardChain is the iptables mangle chain that keeps pod and Service
// traffic on this machine, or "" without a real node.
func (c *Cluster) GuardChain() string {
	if c.state.Node == nil {
		return ""
	}
	return c.state.Node.Net.GuardChain
}

// KubeletRoot is the real node's kubelet root directory.
func (c *Cluster) KubeletRoot() string { return filepath.Join(c.Dir, "kubelet") }

// prepareRealNode leases the machine's real node and a pod subnet and sets
// up the node network; it runs before the control plane, which listens on
// the node address.
func (c *Cluster) prepareRealNode() error {
	if err := leaseRealNode(c.Dir); err != nil {
		return err
	}
	rn := &realNode{Lease: realNodeLease}
	c.state.Node = rn
	subnet, lease, err := leasePodSubnet(c.Dir)
	if err != nil {
		return err
	}
	c.PodSubnet = subnet
	c.state.PodSubnet, c.state.SubnetLock = subnet, lease
	if rn.Net, err = newNodeNetwork(c.state.NetPrefix, subnet); err != nil {
		return err
	}
	if err := c.state.save(); err != nil {
		return err
	}
	if err := rn.Net.setUp(); err != nil {
		return err
	}
	return c.state.save()
}

// startRealNode starts containerd (with the images imported), kubelet,
// kube-proxy and CoreDNS, and waits for the node to be Ready.
func (c *Cluster) startRealNode(ctx context.Context) error {
	logf := c.opts.Logf
	t0 := time.Now()
	rn := c.state.Node
	binDir, err := scriptDir(c.repo, "node.sh", "KUBEFILL_NODE_BIN")
	if err != nil {
		return err
	}
	rn.BinDir = binDir
	rn.KubeProxy = filepath.Join(c.testbin, "kube-proxy")
	rn.ContainerdSocket = filepath.Join(c.Dir, "containerd", "containerd.sock")
	rn.CgroupRoot = "/kubefill-" + c.state.NetPrefix
	rn.CNINetwork = "kubefill-" + c.state.NetPrefix
	rn.KubeletRoot = c.KubeletRoot()
	if err := c.state.save(); err != nil {
		return err
	}
	images := make(chan error, 1)
	imageDir := filepath.Join(c.Dir, "images")
	if d := os.Getenv("KUBEFILL_IMAGES"); d != "" {
		// Archives built already (hack/images.sh DIR).
		imageDir = d
		images <- nil
	} else {
		go func() { images <- buildImages(c.repo, imageDir) }()
	}

	if err := c.startContainerd(ctx); err != nil {
		<-images
		return err
	}
	if err := <-images; err != nil {
		return err
	}
	if err := c.importImages(ctx, imageDir); err != nil {
		return err
	}
	logf("cluster: containerd running with the images imported (%s)", time.Since(t0).Round(time.Millisecond))
	if err := c.startKubelet(ctx); err != nil {
		return err
	}
	logf("cluster: kubelet registered node %s (%s)", c.NodeName, time.Since(t0).Round(time.Millisecond))
	if err := c.startKubeProxy(); err != nil {
		return err
	}
	if err := c.startCoreDNS(ctx); err != nil {
		return err
	}
	if err := c.waitNodeReady(ctx); err != nil {
		return err
	}
	logf("cluster: real node %s ready at %s, pods in %s (%s)", c.NodeName, rn.Net.NodeIP, rn.Net.PodSubnet, time.Since(t0).Round(time.Millisecond))
	return nil
}

// buildImages runs hack/images.sh into dir.
func buildImages(repo, dir string) error {
	cmd := exec.Command("bash", filepath.Join(repo, "hack", "images.sh"), dir)
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("hack/images.sh: %w\n%s", err, tail(string(out), 30))
	}
	return nil
}

func (c *Cluster) ctr(ctx context.Context, args ...string) (string, error) {
	rn := c.state.Node
	full := append([]string{"--address", rn.ContainerdSocket, "--namespace", "k8s.io"}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(rn.BinDir, "ctr"), full...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (c *Cluster) importImages(ctx context.Context, dir string) error {
	for _, a := range imageArchives {
		if _, err := c.ctr(ctx, "images", "import", "--all-platforms", filepath.Join(dir, a)); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	rn := c.state.Node
	dir := filepath.Join(c.Dir, "containerd")
	for _, d := range []string{dir, filepath.Join(c.Dir, "cni", "conf"), filepath.Join(c.Dir, "cni", "ipam")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	conflist := map[string]any{
		"cniVersion": "1.0.0",
		"name":       rn.CNINetwork,
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": rn.Net.CNIBridge, "isGateway": true,
				// No masquerade: pod traffic never leaves the machine.
				"ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  []any{[]any{map[string]any{"subnet": rn.Net.PodSubnet, "gateway": rn.Net.PodGateway}}},
					"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}},
					"dataDir": filepath.Join(c.Dir, "cni", "ipam"),
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}},
		},
	}
	data, err := json.MarshalIndent(conflist, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "cni", "conf", "10-kubefill.conflist"), data, 0o644); err != nil {
		return fmt.Errorf("write CNI config: %w", err)
	}
	config := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[debug]
  level = "info"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %[5]q
  # Every registry name resolves to a closed loopback port: an image that
  # was not imported fails to pull at once, and nothing leaves the machine.
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %[9]q

[plugins."io.containerd.cri.v1.runtime"]
  # This host lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  # A Block volume's device node is owned by the pod's runAsUser/runAsGroup,
  # as KubeVirt and CDI ask of the runtime, so non-root workers can open it.
  device_ownership_from_security_context = true
  cdi_spec_dirs = [%[11]q]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
        Root = %[6]q
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%[7]q]
    conf_dir = %[8]q

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

# Keep containerd's own state out of /opt, and NRI (unused) out of
# /var/run/nri, /opt/nri and /etc/nri.
[plugins."io.containerd.internal.v1.opt"]
  path = %[10]q

[plugins."io.containerd.nri.v1.nri"]
  disable = true
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), rn.ContainerdSocket, rn.ContainerdSocket+".ttrpc",
		PauseImage, filepath.Join(dir, "runc"), rn.BinDir, filepath.Join(c.Dir, "cni", "conf"), filepath.Join(dir, "certs.d"), filepath.Join(dir, "opt"), filepath.Join(dir, "cdi"))
	cfgFile := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgFile, []byte(config), 0o644); err != nil {
		return fmt.Errorf("write containerd config: %w", err)
	}
	hosts := filepath.Join(dir, "certs.d", "_default")
	if err := os.MkdirAll(hosts, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", hosts, err)
	}
	const noRegistry = "server = \"http://127.0.0.1:9\"\n\n[host.\"http://127.0.0.1:9\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
	if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), []byte(noRegistry), 0o644); err != nil {
		return fmt.Errorf("write registry hosts: %w", err)
	}
	env := []string{"PATH=" + rn.BinDir + ":" + os.Getenv("PATH")}
	rec, err := c.run("containerd", env, filepath.Join(rn.BinDir, "containerd"), "--config", cfgFile)
	if err != nil {
		return err
	}
	return waitReady(ctx, rec, componentStartupTimeout, 50*time.Millisecond, "containerd not serving", func(ctx context.Context) (bool, string) {
		out, err := c.ctr(ctx, "version")
		if err != nil {
			return false, out
		}
		return true, ""
	})
}

func (c *Cluster) startKubelet(ctx context.Context) error {
	rn := c.state.Node
	nodeIP := rn.Net.NodeIP
	kc, err := c.writeKubeconfig("kubelet", "system:node:"+c.NodeName, "system:nodes")
	if err != nil {
		return err
	}
	serving, err := issue(c.pki.ca, kit.Leaf{CommonName: "system:node:" + c.NodeName, Organization: []string{"system:nodes"},
		Hosts: []string{nodeIP, c.NodeName}, Server: true})
	if err != nil {
		return err
	}
	certFile, keyFile, err := serving.write(c.pki.dir, "kubelet-serving")
	if err != nil {
		return err
	}
	resolv := filepath.Join(c.Dir, "resolv.conf")
	// Pods must not inherit the host's resolver (it is not on this machine's
	// networks); dnsPolicy Default gets this dead end instead.
	if err := os.WriteFile(resolv, []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		return fmt.Errorf("write resolv.conf: %w", err)
	}
	for _, d := range []string{rn.KubeletRoot, filepath.Join(c.Dir, "static-pods"), filepath.Join(c.Dir, "pod-logs"), filepath.Join(c.Dir, "kubelet-plugins")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	if err := makeCgroupRoot(rn.CgroupRoot); err != nil {
		return err
	}
	config := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// This host has cgroup v1 only, which kubelet refuses by default.
		"failCgroupV1":                false,
		"cgroupDriver":                "cgroupfs",
		"cgroupsPerQOS":               true,
		"cgroupRoot":                  rn.CgroupRoot,
		"enforceNodeAllocatable":      []string{},
		"failSwapOn":                  false,
		"containerRuntimeEndpoint":    "unix://" + rn.ContainerdSocket,
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard": map[string]string{
			"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%", "imagefs.available": "1%",
		},
		"address":            nodeIP,
		"port":               10250,
		"readOnlyPort":       0,
		"healthzBindAddress": "127.0.0.1",
		"healthzPort":        0,
		"tlsCertFile":        certFile,
		"tlsPrivateKeyFile":  keyFile,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": false},
			"x509":      map[string]any{"clientCAFile": c.pki.caFile},
		},
		"authorization":       map[string]any{"mode": "AlwaysAllow"},
		"staticPodPath":       filepath.Join(c.Dir, "static-pods"),
		"podLogsDir":          filepath.Join(c.Dir, "pod-logs"),
		"resolvConf":          resolv,
		"clusterDomain":       "cluster.local",
		"clusterDNS":          []string{kubeDNSIP},
		"volumePluginDir":     filepath.Join(c.Dir, "kubelet-plugins"),
		"serializeImagePulls": false,
		// Pods report status promptly (tests wait on it).
		"nodeStatusUpdateFrequency": "2s",
		"syncFrequency":             "5s",
	}
	data, err := yaml.Marshal(config)
	if err != nil {
		return err
	}
	cfgFile := filepath.Join(c.Dir, "kubelet-config.yaml")
	if err := os.WriteFile(cfgFile, data, 0o644); err != nil {
		return fmt.Errorf("write kubelet config: %w", err)
	}
	rec, err := c.run("kubelet", nil, filepath.Join(c.testbin, "kubelet"),
		"--config="+cfgFile,
		"--kubeconfig="+kc,
		"--root-dir="+rn.KubeletRoot,
		"--hostname-override="+c.NodeName,
		"--node-ip="+nodeIP,
		"--v=2",
	)
	if err != nil {
		return err
	}
	return waitReady(ctx, rec, componentStartupTimeout, 100*time.Millisecond, "kubelet never registered node "+c.NodeName, func(ctx context.Context) (bool, string) {
		_, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

func (c *Cluster) startKubeProxy() error {
	rn := c.state.Node
	kc, err := c.writeKubeconfig("kube-proxy", "system:kube-proxy")
	if err != nil {
		return err
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	config := map[string]any{
		"apiVersion":       "kubeproxy.config.k8s.io/v1alpha1",
		"kind":             "KubeProxyConfiguration",
		"clientConnection": map[string]any{"kubeconfig": kc},
		"mode":             "iptables",
		"clusterCIDR":      rn.Net.PodSubnet,
		"hostnameOverride": c.NodeName,
		"bindAddress":      rn.Net.NodeIP,
		// No NodePorts on any address but the node's own.
		"nodePortAddresses":  []string{rn.Net.NodeIP + "/32"},
		"healthzBindAddress": "127.0.0.1:" + strconv.Itoa(ports[0]),
		"metricsBindAddress": "127.0.0.1:" + strconv.Itoa(ports[1]),
		// Zeros leave the host's conntrack sysctls alone.
		"conntrack": map[string]any{"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
		"iptables":  map[string]any{"syncPeriod": "10s", "minSyncPeriod": "0s"},
	}
	data, err := yaml.Marshal(config)
	if err != nil {
		return err
	}
	cfgFile := filepath.Join(c.Dir, "kube-proxy-config.yaml")
	if err := os.WriteFile(cfgFile, data, 0o644); err != nil {
		return fmt.Errorf("write kube-proxy config: %w", err)
	}
	_, err = c.run("kube-proxy", nil, rn.KubeProxy, "--config="+cfgFile, "--v=1")
	return err
}

// startCoreDNS runs CoreDNS on the host at the node address and makes the
// kube-dns Service point there (an EndpointSlice without a selector).
func (c *Cluster) startCoreDNS(ctx context.Context) error {
	rn := c.state.Node
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	corefile := fmt.Sprintf(`.:53 {
    bind %s
    errors
    ready 127.0.0.1:%d
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %s
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
    loadbalance
}
`, rn.Net.NodeIP, ports[0], c.Kubeconfig)
	cfg := filepath.Join(c.Dir, "Corefile")
	if err := os.WriteFile(cfg, []byte(corefile), 0o644); err != nil {
		return fmt.Errorf("write Corefile: %w", err)
	}
	rec, err := c.run("coredns", nil, filepath.Join(rn.BinDir, "coredns"), "-conf", cfg)
	if err != nil {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: corev1.ServiceSpec{ClusterIP: kubeDNSIP, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
		}},
	}
	if _, err := c.Client.CoreV1().Services("kube-system").Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create kube-dns Service: %w", err)
	}
	udp, tcp, port := corev1.ProtocolUDP, corev1.ProtocolTCP, int32(53)
	dns, dnsTCP := "dns", "dns-tcp"
	ready := true
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns-host", Namespace: "kube-system", Labels: map[string]string{
			discoveryv1.LabelServiceName: "kube-dns", discoveryv1.LabelManagedBy: "kubefill-test-cluster"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{rn.Net.NodeIP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &dns, Protocol: &udp, Port: &port}, {Name: &dnsTCP, Protocol: &tcp, Port: &port}},
	}
	if _, err := c.Client.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create kube-dns EndpointSlice: %w", err)
	}
	return waitReady(ctx, rec, componentStartupTimeout, 100*time.Millisecond, "CoreDNS not ready", func(ctx context.Context) (bool, string) {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(rn.Net.NodeIP, "53"), time.Second)
		if err != nil {
			return false, err.Error()
		}
		conn.Close()
		return true, ""
	})
}

// waitNodeReady waits for the node to be Ready and untainted and for the
// CSI node plugin to have registered, when storage runs.
func (c *Cluster) waitNodeReady(ctx context.Context) error {
	var rec procRecord
	for _, p := range c.state.Processes {
		if p.Name == "kubelet" {
			rec = p
		}
	}
	return waitReady(ctx, rec, componentStartupTimeout, 100*time.Millisecond, "node "+c.NodeName+" never became Ready", func(ctx context.Context) (bool, string) {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, t := range node.Spec.Taints {
			if t.Key == "node.kubernetes.io/not-ready" {
				return false, "not-ready taint"
			}
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, cond.Reason + ": " + cond.Message
			}
		}
		return false, "no Ready condition"
	})
}

// makeCgroupRoot creates the cgroup kubelet puts every pod under in each
// v1 hierarchy (kubelet requires it to exist). A new cpuset cgroup starts
// with no CPUs and no memory nodes; it gets its parent's.
func makeCgroupRoot(root string) error {
	hierarchies, err := filepath.Glob("/sys/fs/cgroup/*")
	if err != nil {
		return err
	}
	for _, h := range hierarchies {
		if filepath.Base(h) == "unified" {
			continue
		}
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err != nil {
			continue
		}
		d := filepath.Join(h, root)
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("create cgroup %s: %w", d, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return fmt.Errorf("read %s: %w", f, err)
				}
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("write %s/%s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}
