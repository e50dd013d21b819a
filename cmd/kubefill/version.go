package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"
)

// version is stamped at link time: -ldflags "-X main.version=v0.1.0".
var version = "v0.0.0-dev"

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the Kubefill version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "kubefill %s (%s, %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		},
	}
}
