package cluster

import (
	"context"
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// SharedClusterEnv names the directory of a running cluster (`kubefill-dev
// up --dir`) that a test package runs on instead of starting its own:
// tests/installed and then tests/load share one this way in hack/test.sh,
// which starts it, and stops it and checks the host after both.
const SharedClusterEnv = "KUBEFILL_SHARED_CLUSTER"

// StartOrAttach attaches to the cluster named by SharedClusterEnv when it
// is set, and otherwise starts one with opts. An attached cluster must
// have what opts asks for (a node, storage).
func StartOrAttach(ctx context.Context, opts Options) (*Cluster, error) {
	dir := os.Getenv(SharedClusterEnv)
	if dir == "" {
		return Start(ctx, opts)
	}
	c, err := Attach(dir, opts.Logf)
	if err != nil {
		return nil, err
	}
	if opts.Node && c.state.Node == nil {
		return nil, fmt.Errorf("the cluster in %s (%s) runs no real node, and the tests need one", dir, SharedClusterEnv)
	}
	if opts.Storage && !c.opts.Storage {
		return nil, fmt.Errorf("the cluster in %s (%s) runs no CSI driver, and the tests need one", dir, SharedClusterEnv)
	}
	if opts.KubefillCRDs {
		// Those a package before left stay; kube-controller-manager's garbage
		// collector finds new ones within its 30 s discovery resync.
		c.opts.KubefillCRDs = true
		if err := c.installCRDs(ctx); err != nil {
			return nil, fmt.Errorf("Kubefill's CRDs on the cluster in %s: %w", dir, err)
		}
	}
	return c, nil
}

// Attach returns the cluster running in dir, started by another process.
// Its Stop leaves the cluster running: whoever started it stops it.
// Restart does not know how its components were started.
func Attach(dir string, logf func(string, ...any)) (*Cluster, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	st, err := LoadState(dir)
	if err != nil {
		return nil, err
	}
	if !st.Running() {
		return nil, fmt.Errorf("no cluster runs in %s: its processes are gone", dir)
	}
	if st.Kubeconfig == "" {
		return nil, fmt.Errorf("the cluster in %s has no kubeconfig yet", dir)
	}
	repo, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		Dir:        st.Dir,
		Kubeconfig: st.Kubeconfig,
		NodeName:   DefaultNodeName,
		PodSubnet:  st.PodSubnet,
		opts:       Options{Dir: st.Dir, Node: st.Node != nil, Storage: runsStorage(st), Logf: logf},
		state:      st,
		repo:       repo,
		attached:   true,
	}
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return nil, fmt.Errorf("load admin kubeconfig of %s: %w", dir, err)
	}
	c.Config.QPS, c.Config.Burst = 100, 200
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return nil, fmt.Errorf("admin client of %s: %w", dir, err)
	}
	if c.opts.Node {
		// The same build the starting process used, found up to date in the cache.
		if c.kubefillBin, err = goBuild(repo, "./cmd/kubefill", "kubefill"); err != nil {
			return nil, fmt.Errorf("kubefill binary for the cluster in %s: %w", dir, err)
		}
	}
	logf("cluster: attached to the cluster in %s (kubeconfig %s)", c.Dir, c.Kubeconfig)
	return c, nil
}

// runsStorage says whether the cluster st describes runs the CSI driver.
func runsStorage(st *State) bool {
	for _, p := range st.Processes {
		if p.Name == "csi-driver" {
			return true
		}
	}
	return false
}

// Attached says whether the cluster was started by another process
// (Attach): its Stop leaves it running, and that process checks the host.
func (c *Cluster) Attached() bool { return c.attached }

// StopAndCheck stops the cluster and lists what it left on the host (see
// State.Leftovers). An attached cluster stays running and is not checked:
// whoever started it does both.
func (c *Cluster) StopAndCheck() error {
	if c.attached {
		return nil
	}
	state := c.State()
	if err := c.Stop(); err != nil {
		return fmt.Errorf("stop local cluster: %w", err)
	}
	if left := state.Leftovers(); len(left) > 0 {
		return fmt.Errorf("left behind after Stop: %s", strings.Join(left, ", "))
	}
	return nil
}
