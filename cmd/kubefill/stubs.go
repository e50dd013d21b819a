package main

import "github.com/spf13/cobra"

// notImplemented builds a subcommand for a component that has not landed yet.
// It fails loudly rather than pretending to work.
func notImplemented(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short + " (not implemented yet)",
		RunE: func(*cobra.Command, []string) error {
			return errNotImplemented
		},
	}
}

func newClonerCommand() *cobra.Command {
	return notImplemented("cloner", "Stream a source volume for a host-assisted clone")
}
