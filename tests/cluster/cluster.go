// Package cluster starts and stops a real single-node Kubernetes cluster on
// this machine for end-to-end tests and the dev job: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler built from the Go module proxy
// (hack/testbin.sh), our hostpath CSI driver with the real CSI sidecars
// (hack/sidecars.sh), and a real node: containerd, kubelet, kube-proxy and
// CoreDNS (hack/testbin.sh, hack/node.sh) running pods from images built
// here (hack/images.sh).
//
// It is test infrastructure: the product binary never links it.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubefill/kubefill/tests/kit"
)

// Names of the storage objects the cluster installs.
const (
	DriverName                = "hostpath.csi.kubefill.test"
	StorageClassImmediate     = "kubefill-hostpath"
	StorageClassWFFC          = "kubefill-hostpath-wffc"
	VolumeSnapshotClass       = "kubefill-hostpath-snapclass"
	DefaultNodeName           = "kubefill-node"
	serviceClusterIPRange     = "10.96.0.0/24"
	serviceAccountIssuer      = "https://kubernetes.default.svc.cluster.local"
	componentStartupTimeout   = 60 * time.Second
	controlPlaneReadyInterval = 100 * time.Millisecond
)

// Options selects what Start brings up.
type Options struct {
	// Dir holds everything the cluster writes: certificates, kubeconfigs,
	// etcd's data, logs, CSI volumes and pod directories. Default: a new
	// temporary directory, removed by Stop.
	Dir string
	// Storage starts the hostpath CSI driver, its sidecars and the
	// snapshot controller, and installs the storage classes.
	Storage bool
	// Node runs a real node: containerd, kubelet, kube-proxy and CoreDNS,
	// with every pod from images built here (hack/images.sh), and
	// kube-apiserver on the node's private address. One machine runs one
	// real node at a time.
	Node bool
	// Kubefill installs Kubefill's CRDs (manifests/crd) and runs its
	// controller, API server and upload proxy from this checkout against the
	// cluster (needs Node, whose build of the kubefill binary it uses).
	Kubefill bool
	// KubefillCRDs installs Kubefill's CRDs without running Kubefill (tests
	// that run its controllers themselves).
	KubefillCRDs bool
	// Detach lets the processes outlive the caller (for `kubefill-dev up`).
	Detach bool
	// KeepDir keeps Dir after Stop (logs stay readable).
	KeepDir bool
	// HelperBinary is the kubefill-dev binary (the CSI driver's host side).
	// Default: built from this checkout into the cache.
	HelperBinary string
	// Logf receives progress lines. Default: discard.
	Logf func(format string, args ...any)
}

// Cluster is a running local cluster.
type Cluster struct {
	// Dir is the cluster's directory.
	Dir string
	// Kubeconfig is the path of an admin (system:masters) kubeconfig.
	Kubeconfig string
	// Config is the admin REST config.
	Config *rest.Config
	// Client is an admin clientset.
	Client kubernetes.Interface
	// NodeName is the name of the node kubelet registers.
	NodeName string
	// PodSubnet is the private range pods get their addresses from.
	PodSubnet string
	// StartupDuration is how long Start took.
	StartupDuration time.Duration

	opts        Options
	state       *State
	repo        string
	testbin     string
	pki         *clusterPKI
	apiserver   string
	ownsDir     bool
	kubefillBin string
	// attached: another process started the cluster and stops it (Attach).
	attached bool

	stopMu  sync.Mutex
	stopped bool

	// launches remembers how each component was started, so that Restart
	// can start it again the same way.
	launches map[string]launch
}

// StartT starts a cluster for a test and stops it in t.Cleanup. It fails the
// test when the cluster cannot start.
func StartT(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	c, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("start local cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop local cluster: %v", err)
		}
	})
	return c
}

// Start brings a cluster up and returns once the API is ready and, when
// asked for, storage and the node are ready too. On error it removes what it
// had started.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	begin := time.Now()
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if os.Geteuid() != 0 && (opts.Storage || opts.Node) {
		return nil, errors.New("the local cluster's storage and node need root (mounts, cgroups, iptables)")
	}
	repo, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, repo: repo, NodeName: DefaultNodeName}
	if opts.Dir == "" {
		d, err := os.MkdirTemp("", "kubefill-cluster-")
		if err != nil {
			return nil, fmt.Errorf("create cluster dir: %w", err)
		}
		c.Dir = d
		// KUBEFILL_KEEP_CLUSTER_DIR=1 keeps logs for a post-mortem.
		c.ownsDir = !opts.KeepDir && os.Getenv("KUBEFILL_KEEP_CLUSTER_DIR") == ""
	} else {
		d, err := filepath.Abs(opts.Dir)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("create cluster dir: %w", err)
		}
		if _, err := os.Stat(filepath.Join(d, stateFile)); err == nil {
			return nil, fmt.Errorf("%s already holds a cluster; tear it down first (kubefill-dev down --dir %s)", d, d)
		}
		c.Dir = d
		c.ownsDir = false
	}
	c.state = &State{Dir: c.Dir, NetPrefix: linkNamespace + randomHex(2)}
	if err := c.state.save(); err != nil {
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		if stopErr := c.Stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("clean up after failed start: %w", stopErr))
		}
		return nil, err
	}
	c.StartupDuration = time.Since(begin)
	opts.Logf("cluster: ready in %s (dir %s, kubeconfig %s)", c.StartupDuration.Round(time.Millisecond), c.Dir, c.Kubeconfig)
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	logf := c.opts.Logf
	t0 := time.Now()
	testbin, err := scriptDir(c.repo, "testbin.sh", "KUBEFILL_TESTBIN")
	if err != nil {
		return err
	}
	c.testbin = testbin
	logf("cluster: control-plane binaries in %s (%s)", testbin, time.Since(t0).Round(time.Millisecond))

	// Our own binaries build (or are found up to date) while the control
	// plane starts.
	builds := make(chan error, 1)
	go func() { builds <- c.buildBinaries() }()

	if c.opts.Node {
		if err := c.prepareRealNode(); err != nil {
			<-builds
			return err
		}
	}
	if err := c.startControlPlane(ctx); err != nil {
		<-builds
		return err
	}
	if err := <-builds; err != nil {
		return err
	}
	if c.opts.Storage {
		if err := c.startStorage(ctx); err != nil {
			return err
		}
	}
	if c.opts.Node {
		if err := c.startRealNode(ctx); err != nil {
			return err
		}
		if c.opts.Storage {
			if err := c.startCSINodePlugin(ctx); err != nil {
				return err
			}
		}
	}
	if c.opts.Kubefill {
		if err := c.startKubefill(ctx); err != nil {
			return err
		}
	}
	// Pods need their namespace's default service account, which
	// kube-controller-manager makes; it has been starting all along.
	if err := c.waitServiceAccount(ctx, "default", "default"); err != nil {
		return err
	}
	return nil
}

// buildBinaries builds the helper binary and, with a node, the kubefill
// binary that Kubefill's host-side processes run.
func (c *Cluster) buildBinaries() error {
	logf := c.opts.Logf
	if (c.opts.Storage || c.opts.Node) && c.opts.HelperBinary == "" {
		t := time.Now()
		bin, err := goBuild(c.repo, "./tests/cluster/cmd/kubefill-dev", "kubefill-dev")
		if err != nil {
			return err
		}
		c.opts.HelperBinary = bin
		logf("cluster: helper binary %s (%s)", bin, time.Since(t).Round(time.Millisecond))
	}
	if c.opts.Node {
		t := time.Now()
		bin, err := goBuild(c.repo, "./cmd/kubefill", "kubefill")
		if err != nil {
			logf("cluster: WARNING: kubefill images will not run: %v", err)
			return nil
		}
		c.kubefillBin = bin
		logf("cluster: kubefill binary %s (%s)", bin, time.Since(t).Round(time.Millisecond))
	}
	return nil
}

// State returns a copy of what the cluster recorded about itself (for
// checking, after Stop, that nothing is left: see State.Leftovers).
func (c *Cluster) State() State {
	s := *c.state
	s.Processes = append([]procRecord(nil), c.state.Processes...)
	return s
}

// Stop tears everything down. It is safe to call more than once. An
// attached cluster (Attach) is left running for the process that started it.
func (c *Cluster) Stop() error {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	if c.stopped || c.attached {
		return nil
	}
	c.stopped = true
	return Teardown(c.Dir, c.ownsDir)
}

// Logs returns the path of a component's log file.
func (c *Cluster) Logs(component string) string {
	return filepath.Join(c.Dir, "logs", component+".log")
}

func (c *Cluster) addProcess(rec procRecord) error {
	c.state.Processes = append(c.state.Processes, rec)
	return c.state.save()
}

func (c *Cluster) run(name string, env []string, bin string, args ...string) (procRecord, error) {
	rec, err := startProcess(c.Dir, name, c.opts.Detach, env, bin, args...)
	if err != nil {
		return rec, err
	}
	if c.launches == nil {
		c.launches = map[string]launch{}
	}
	c.launches[name] = launch{env: env, bin: bin, args: args}
	return rec, c.addProcess(rec)
}

// AdminUser is the user name of the cluster's admin kubeconfig (group
// system:masters), which the harness's own Kubefill processes use.
const AdminUser = "kubefill-admin"

// clusterPKI holds the files of the cluster's certificates.
type clusterPKI struct {
	dir                  string
	ca                   *kit.CA
	caFile               string
	frontProxyCAFile     string
	apiserverCert        string
	apiserverKey         string
	frontProxyClientCert string
	frontProxyClientKey  string
	saPub                string
	saKey                string
	caKeyFile            string
	// admissionConfig presents WebhookClientName to Kubefill's webhooks.
	admissionConfig string
}

func (c *Cluster) writePKI() error {
	dir := filepath.Join(c.Dir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create pki dir: %w", err)
	}
	ca, err := kit.NewCA("kubefill-local-ca", caValidity)
	if err != nil {
		return err
	}
	p := &clusterPKI{dir: dir, ca: ca, caFile: filepath.Join(dir, "ca.crt")}
	if err := os.WriteFile(p.caFile, ca.CertPEM, 0o644); err != nil {
		return fmt.Errorf("write CA: %w", err)
	}
	if _, p.caKeyFile, err = (keyPair{CertPEM: ca.CertPEM, KeyPEM: ca.KeyPEM}).write(dir, "ca"); err != nil {
		return err
	}
	hosts := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local", "127.0.0.1", kubernetesSvc}
	if ip := c.NodeIP(); ip != "" {
		hosts = append(hosts, ip)
	}
	serving, err := issue(ca, kit.Leaf{CommonName: "kube-apiserver", Hosts: hosts, Server: true})
	if err != nil {
		return err
	}
	if p.apiserverCert, p.apiserverKey, err = serving.write(dir, "apiserver"); err != nil {
		return err
	}
	fpCA, err := kit.NewCA("kubefill-front-proxy-ca", caValidity)
	if err != nil {
		return err
	}
	p.frontProxyCAFile = filepath.Join(dir, "front-proxy-ca.crt")
	if err := os.WriteFile(p.frontProxyCAFile, fpCA.CertPEM, 0o644); err != nil {
		return fmt.Errorf("write front-proxy CA: %w", err)
	}
	fpClient, err := issue(fpCA, kit.Leaf{CommonName: "front-proxy-client", Client: true})
	if err != nil {
		return err
	}
	if p.frontProxyClientCert, p.frontProxyClientKey, err = fpClient.write(dir, "front-proxy-client"); err != nil {
		return err
	}
	if p.saPub, p.saKey, err = writeServiceAccountKeys(dir); err != nil {
		return err
	}
	if p.admissionConfig, err = writeAdmissionConfig(p); err != nil {
		return err
	}
	c.pki = p
	return nil
}

// writeKubeconfig issues a client certificate for user/groups and writes a
// kubeconfig that uses it.
func (c *Cluster) writeKubeconfig(name, user string, groups ...string) (string, error) {
	kp, err := issue(c.pki.ca, kit.Leaf{CommonName: user, Organization: groups, Client: true})
	if err != nil {
		return "", err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: c.apiserver, CertificateAuthorityData: c.pki.ca.CertPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.CertPEM, ClientKeyData: kp.KeyPEM}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: user}
	cfg.CurrentContext = "local"
	path := filepath.Join(c.Dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return path, nil
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	logf := c.opts.Logf
	t0 := time.Now()
	if err := c.writePKI(); err != nil {
		return err
	}
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer, apiPort := ports[0], ports[1], ports[2]
	// With a real node, kube-apiserver listens on the node's private
	// address only: pods reach it there through the kubernetes Service, and
	// kubelet cannot use loopback. Never 0.0.0.0.
	bindAddress := "127.0.0.1"
	if ip := c.NodeIP(); ip != "" {
		bindAddress = ip
	}
	c.apiserver = "https://" + net.JoinHostPort(bindAddress, strconv.Itoa(apiPort))

	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	etcdRec, err := c.run("etcd", nil, filepath.Join(c.testbin, "etcd"),
		"--name=kubefill",
		"--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubefill="+peerURL,
		"--listen-metrics-urls=",
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	if err := waitTCP(ctx, etcdRec, "127.0.0.1:"+strconv.Itoa(etcdClient)); err != nil {
		return err
	}

	p := c.pki
	apiArgs := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + bindAddress,
		"--secure-port=" + strconv.Itoa(apiPort),
		"--tls-cert-file=" + p.apiserverCert,
		"--tls-private-key-file=" + p.apiserverKey,
		"--client-ca-file=" + p.caFile,
		"--service-account-issuer=" + serviceAccountIssuer,
		"--service-account-key-file=" + p.saPub,
		"--service-account-signing-key-file=" + p.saKey,
		"--service-cluster-ip-range=" + serviceClusterIPRange,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--cert-dir=" + filepath.Join(c.Dir, "pki", "apiserver-generated"),
		"--requestheader-client-ca-file=" + p.frontProxyCAFile,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + p.frontProxyClientCert,
		"--proxy-client-key-file=" + p.frontProxyClientKey,
		"--enable-aggregator-routing=true",
		// Kubefill's webhooks get a client certificate, so that an install
		// can require it (--webhook-client-names).
		"--admission-control-config-file=" + p.admissionConfig,
		"--v=1",
	}
	if bindAddress == "127.0.0.1" {
		// No node to publish as the kubernetes Service's endpoint.
		apiArgs = append(apiArgs, "--endpoint-reconciler-type=none")
	} else {
		kubeletClient, err := issue(p.ca, kit.Leaf{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}, Client: true})
		if err != nil {
			return err
		}
		certFile, keyFile, err := kubeletClient.write(p.dir, "apiserver-kubelet-client")
		if err != nil {
			return err
		}
		apiArgs = append(apiArgs, "--advertise-address="+bindAddress,
			"--kubelet-client-certificate="+certFile, "--kubelet-client-key="+keyFile,
			"--kubelet-certificate-authority="+p.caFile, "--kubelet-preferred-address-types=InternalIP")
	}
	apiRec, err := c.run("kube-apiserver", nil, filepath.Join(c.testbin, "kube-apiserver"), apiArgs...)
	if err != nil {
		return err
	}

	c.Kubeconfig, err = c.writeKubeconfig("admin", AdminUser, "system:masters")
	if err != nil {
		return err
	}
	c.state.Kubeconfig = c.Kubeconfig
	if err := c.state.save(); err != nil {
		return err
	}
	c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("load admin kubeconfig: %w", err)
	}
	c.Config.QPS, c.Config.Burst = 100, 200
	c.Client, err = kubernetes.NewForConfig(c.Config)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	if err := c.waitAPIReady(ctx, apiRec); err != nil {
		return err
	}
	logf("cluster: etcd and kube-apiserver ready (%s)", time.Since(t0).Round(time.Millisecond))
	// Before kube-controller-manager: its garbage collector sees the types
	// that exist when it starts, and later ones only at its 30 s rediscovery;
	// until then, deleting an owner of a new type would not cascade.
	if err := c.installCRDs(ctx); err != nil {
		return err
	}

	kcmConfig, err := c.writeKubeconfig("kube-controller-manager", "system:kube-controller-manager")
	if err != nil {
		return err
	}
	if _, err := c.run("kube-controller-manager", nil, filepath.Join(c.testbin, "kube-controller-manager"),
		"--kubeconfig="+kcmConfig,
		"--authentication-kubeconfig="+kcmConfig,
		"--authorization-kubeconfig="+kcmConfig,
		"--controllers=*",
		"--leader-elect=false",
		"--secure-port=0",
		"--service-account-private-key-file="+p.saKey,
		"--root-ca-file="+p.caFile,
		"--use-service-account-credentials=true",
		"--cluster-signing-cert-file="+p.caFile,
		"--cluster-signing-key-file="+p.caKeyFile,
		"--flex-volume-plugin-dir="+filepath.Join(c.Dir, "flexvolume"),
		"--pvclaimbinder-sync-period=1s",
		"--service-cluster-ip-range="+serviceClusterIPRange,
		"--v=1",
	); err != nil {
		return err
	}
	schedConfig, err := c.writeKubeconfig("kube-scheduler", "system:kube-scheduler")
	if err != nil {
		return err
	}
	if _, err := c.run("kube-scheduler", nil, filepath.Join(c.testbin, "kube-scheduler"),
		"--kubeconfig="+schedConfig,
		"--authentication-kubeconfig="+schedConfig,
		"--authorization-kubeconfig="+schedConfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--v=1",
	); err != nil {
		return err
	}
	logf("cluster: control plane started (%s)", time.Since(t0).Round(time.Millisecond))
	return nil
}

func (c *Cluster) waitAPIReady(ctx context.Context, rec procRecord) error {
	return waitReady(ctx, rec, componentStartupTimeout, controlPlaneReadyInterval, "kube-apiserver not ready", func(ctx context.Context) (bool, string) {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return false, err.Error()
		}
		return strings.TrimSpace(string(body)) == "ok", "/readyz: " + strings.TrimSpace(string(body))
	})
}

// waitServiceAccount waits until the service-account controller has made a
// namespace's service account (pods cannot be created before it exists).
func (c *Cluster) waitServiceAccount(ctx context.Context, ns, name string) error {
	ctx, cancel := context.WithTimeout(ctx, componentStartupTimeout)
	defer cancel()
	for {
		_, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1GetOptions)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("service account %s/%s never appeared (is kube-controller-manager running? see %s): %w",
				ns, name, c.Logs("kube-controller-manager"), err)
		case <-time.After(controlPlaneReadyInterval):
		}
	}
}

// WaitServiceAccount waits for the default service account of a namespace,
// which pods need before they can be created.
func (c *Cluster) WaitServiceAccount(ctx context.Context, ns string) error {
	return c.waitServiceAccount(ctx, ns, "default")
}

func waitTCP(ctx context.Context, rec procRecord, addr string) error {
	return waitReady(ctx, rec, componentStartupTimeout, 50*time.Millisecond, rec.Name+" not listening on "+addr, func(context.Context) (bool, string) {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, err.Error()
		}
		conn.Close()
		return true, ""
	})
}

// freePorts asks the kernel for n free loopback ports.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
