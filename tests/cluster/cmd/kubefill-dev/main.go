// Command kubefill-dev is the local cluster's multi-call helper binary, built
// from tests/ and never shipped:
//
//	kubefill-dev up [--dir DIR]     start the local cluster and leave it running
//	                                (--kubefill: Kubefill runs on the host; --installed:
//	                                installed from manifests/ as Deployments)
//	kubefill-dev down [--dir DIR]   remove everything `up` made
//	kubefill-dev demo --kubeconfig  a PVC provisioned, bound, written and read by pods
//	kubefill-dev csi-driver ...     the hostpath CSI driver
//	kubefill-dev csi-resizer ...    volume expansion for it (external-resizer's part)
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubefill/kubefill/tests/csi/hostpath"
	"github.com/kubefill/kubefill/tests/csi/resizer"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "up":
		err = runUp(args)
	case "down":
		err = runDown(args)
	case "demo":
		err = runDemo(args)
	case "csi-driver":
		err = runCSIDriver(args)
	case "csi-resizer":
		err = runCSIResizer(args)
	case "-h", "--help", "help":
		usage()
		return
	default:
		fmt.Fprintf(os.Stderr, "kubefill-dev: unknown command %q\n", cmd)
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubefill-dev %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: kubefill-dev <command> [flags]

commands:
  up          start the local cluster (control plane, CSI storage, real node) and leave it running;
              --kubefill runs Kubefill on the host, --installed installs it from manifests/
  down        stop the local cluster and remove its processes, pods, mounts, links, cgroups and iptables rules
  demo        provision a PVC on the default class, write it from a pod, read it back from another
  csi-driver  serve the hostpath CSI driver
  csi-resizer grow the driver's volumes when their claims ask for more
`)
}

// signalContext is cancelled on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

func runCSIDriver(args []string) error {
	fs := flag.NewFlagSet("csi-driver", flag.ExitOnError)
	name := fs.String("name", "hostpath.csi.kubefill.test", "CSI driver name")
	endpoint := fs.String("endpoint", "", "unix socket path to serve on")
	dataDir := fs.String("data-dir", "", "directory that holds volumes and snapshots (the same path for every process that shares it)")
	nodeID := fs.String("node-id", "", "node id reported by NodeGetInfo (required with the node service)")
	mode := fs.String("mode", string(hostpath.ModeAll), "services to serve: all, controller (Identity+Controller, for the sidecars) or node (Identity+Node, for kubelet)")
	regSocket := fs.String("registration-socket", "", "serve kubelet's plugin registration API here (<kubelet-root>/plugins_registry/<name>-reg.sock); node or all mode")
	kubeletEndpoint := fs.String("kubelet-endpoint", "", "CSI socket path kubelet dials, as registered (default: --endpoint)")
	blockPublish := fs.String("block-publish", "", "how Block volumes are published: loop (a loop device node, for kubelet) or file (the backing file, for the node agent); default loop in node mode, file otherwise")
	_ = fs.Parse(args)
	m, err := hostpath.ParseMode(*mode)
	if err != nil {
		return err
	}
	d, err := hostpath.New(hostpath.Config{
		Name: *name, Endpoint: *endpoint, DataDir: *dataDir, NodeID: *nodeID, Mode: m,
		RegistrationSocket: *regSocket, KubeletEndpoint: *kubeletEndpoint,
		BlockPublish: hostpath.BlockPublish(*blockPublish), Logf: log.Printf,
	})
	if err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	log.Printf("hostpath CSI driver %s (mode %s) serving on %s", *name, m, *endpoint)
	if *regSocket != "" {
		log.Printf("hostpath CSI driver %s: kubelet registration on %s", *name, *regSocket)
	}
	return d.Serve(ctx)
}

func runCSIResizer(args []string) error {
	fs := flag.NewFlagSet("csi-resizer", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster")
	driver := fs.String("driver", "hostpath.csi.kubefill.test", "CSI driver name whose volumes to grow")
	endpoint := fs.String("endpoint", "", "the driver's unix socket")
	_ = fs.Parse(args)
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	log.Printf("csi-resizer for %s at %s", *driver, *endpoint)
	return (&resizer.Resizer{Client: kc, Driver: *driver, Endpoint: *endpoint, Logf: log.Printf}).Run(ctx)
}
