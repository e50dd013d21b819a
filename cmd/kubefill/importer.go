package main

import "github.com/spf13/cobra"

// Owned by the data-path work (issue 4); replaced when the importer lands.
func newImporterCommand() *cobra.Command {
	return notImplemented("importer", "Import a disk image into a volume inside the importer pod")
}
