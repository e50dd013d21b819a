package main

import (
	"context"
	"os"

	"github.com/spf13/cobra"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/importer"
)

// newImporterCommand runs one import job inside an importer pod. The job
// comes from CDI's importer environment variables (see package contract);
// the flags only override where things are.
func newImporterCommand() *cobra.Command {
	p := importer.DefaultPaths()
	var verbose bool
	cmd := &cobra.Command{
		Use:   "importer",
		Short: "Import a disk image into a volume inside the importer pod",
		Long: "Import a disk image (HTTP(S), S3, registry or blank) into a volume.\n" +
			"The job is read from the environment (IMPORTER_SOURCE, IMPORTER_ENDPOINT, IMPORTER_CONTENTTYPE,\n" +
			"IMPORTER_IMAGE_SIZE, IMPORTER_ACCESS_KEY_ID, IMPORTER_SECRET_KEY, IMPORTER_CERT_DIR, IMPORTER_CHECKSUM,\n" +
			"FILESYSTEM_OVERHEAD, PREALLOCATION, OWNER_UID, ...). The outcome is written as JSON to the termination log.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := zap.New(zap.UseDevMode(verbose))
			ctrllog.SetLogger(log)
			cfg, err := importer.ConfigFromEnv(os.Getenv, os.Environ())
			if err != nil {
				text, permanent := err.Error(), true // a bad job description stays bad
				_ = contract.WriteTermination(p.TerminationLog, contract.TerminationMessage{Outcome: contract.OutcomeFailed, Message: &text, Permanent: &permanent})
				return err
			}
			ctx, stop := importer.SignalContext(context.Background())
			defer stop()
			return importer.Run(ctx, cfg, p, log.WithName("importer"))
		},
	}
	f := cmd.Flags()
	f.StringVar(&p.DataPath, "data-path", p.DataPath, "image file on a Filesystem volume")
	f.StringVar(&p.BlockPath, "block-path", p.BlockPath, "device of a Block volume (used when it exists)")
	f.StringVar(&p.ScratchDir, "scratch-dir", p.ScratchDir, "scratch directory for formats that need conversion (used when it exists)")
	f.StringVar(&p.TerminationLog, "termination-log", p.TerminationLog, "where the JSON termination message is written")
	f.StringVar(&p.MetricsAddr, "metrics-addr", p.MetricsAddr, "address of the TLS /metrics endpoint; empty disables it")
	f.StringVar(&p.MetricsCert, "metrics-cert-file", "", "TLS certificate for metrics (default: self-signed)")
	f.StringVar(&p.MetricsKey, "metrics-key-file", "", "TLS key for metrics (default: self-signed)")
	f.BoolVarP(&verbose, "verbose", "v", false, "verbose logging")
	return cmd
}
