package main

import "github.com/spf13/cobra"

func newControllerCommand() *cobra.Command {
	return notImplemented("controller", "Run the Kubefill controllers")
}
