// Command kubefill is the one multi-call binary for every Kubefill component:
// the controller manager, the aggregated API server, and the data-path workers
// that run inside worker pods. One binary keeps link time and image size down.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "kubefill",
		Short:         "Kubefill fills PersistentVolumeClaims with virtual-machine disks",
		Long:          "Kubefill imports, uploads and clones virtual-machine disks into PersistentVolumeClaims.\nIt serves CDI's cdi.kubevirt.io/v1beta1 API, so KubeVirt and virtctl work against it unchanged.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newVersionCommand(),
		newControllerCommand(),
		newAPIServerCommand(),
		newImporterCommand(),
		newUploadServerCommand(),
		newUploadProxyCommand(),
		newClonerWorkerCommand(),
		newUploadCommand(),
		newPollerCommand(),
	)
	return root
}

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kubefill:", err)
		os.Exit(1)
	}
}
