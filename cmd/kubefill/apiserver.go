package main

import "github.com/spf13/cobra"

// Owned by the token and API server work (issue 5); replaced when it lands.
func newAPIServerCommand() *cobra.Command {
	return notImplemented("apiserver", "Serve the upload.cdi.kubevirt.io aggregated API and admission webhooks")
}
