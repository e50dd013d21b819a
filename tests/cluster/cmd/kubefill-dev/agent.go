package main

import (
	"errors"
	"flag"
	"log"

	"github.com/kubefill/kubefill/tests/nodeagent"
)

func runNodeAgent(args []string) error {
	fs := flag.NewFlagSet("node-agent", flag.ExitOnError)
	var cfg nodeagent.Config
	fs.StringVar(&cfg.NodeName, "node-name", "kubefill-node", "name of the Node to register")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig with the node's identity")
	fs.StringVar(&cfg.Dir, "dir", "", "directory for pod volumes, logs and roots")
	fs.StringVar(&cfg.CSIEndpoint, "csi-endpoint", "", "CSI driver socket")
	fs.StringVar(&cfg.DriverName, "driver-name", "hostpath.csi.kubefill.test", "CSI driver name")
	fs.StringVar(&cfg.PodSubnet, "pod-subnet", "", "private IPv4 range for pod addresses")
	fs.StringVar(&cfg.LinkPrefix, "link-prefix", "", "prefix of every network namespace and link the agent makes")
	fs.StringVar(&cfg.Images.KubefillBinary, "kubefill-binary", "", "kubefill binary that kubefill images run")
	_ = fs.Parse(args)
	if cfg.Kubeconfig == "" || cfg.Dir == "" || cfg.CSIEndpoint == "" || cfg.PodSubnet == "" || cfg.LinkPrefix == "" {
		return errors.New("--kubeconfig, --dir, --csi-endpoint, --pod-subnet and --link-prefix are required")
	}
	self, err := osExecutable()
	if err != nil {
		return err
	}
	cfg.HelperBinary = self
	cfg.Logf = log.Printf
	ctx, cancel := signalContext()
	defer cancel()
	return nodeagent.Run(ctx, cfg)
}

func runPodInit(args []string) error {
	fs := flag.NewFlagSet("pod-init", flag.ExitOnError)
	spec := fs.String("spec", "", "container spec file written by the node agent")
	_ = fs.Parse(args)
	if *spec == "" {
		return errors.New("--spec is required")
	}
	return nodeagent.RunPodInit(*spec)
}
