package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kubefill/kubefill/pkg/cloner"
	"github.com/kubefill/kubefill/pkg/contract"
)

// newClonerWorkerCommand runs the source side of one host-assisted clone
// inside the clone source pod: it reads the source volume read-only and
// streams it over mutual TLS to the target's upload server. The job comes
// from CDI's cloner environment (VOLUME_MODE, MOUNT_POINT, UPLOAD_URL,
// OWNER_UID, PREALLOCATION, SERVER_CA_CERT, CLIENT_CERT, CLIENT_KEY); flags
// override it.
//
// It replaces the stub newClonerCommand in stubs.go, which main.go still
// registers until that stub is removed and main.go calls this instead.
func newClonerWorkerCommand() *cobra.Command {
	var (
		verbose                 bool
		mode, mountPoint        string
		uploadURL, ownerUID     string
		caFile, certFile, kFile string
		prealloc, compressAll   bool
		terminationLog          = contract.TerminationLog
		metricsAddr             = ":" + strconv.Itoa(contract.MetricsPort)
	)
	cmd := &cobra.Command{
		Use:   "cloner",
		Short: "Stream a source volume for a host-assisted clone",
		Long: "Stream a source volume (Filesystem, mounted at " + cloner.SourceMountPoint + ", or Block, " + contract.BlockPath + ")\n" +
			"read-only to the target's upload server over mutual TLS, as CDI's clone source pod does.\n" +
			"The job is read from the environment (VOLUME_MODE, MOUNT_POINT, UPLOAD_URL, OWNER_UID, PREALLOCATION,\n" +
			"SERVER_CA_CERT, CLIENT_CERT, CLIENT_KEY: PEM, or files holding it); flags override it.\n" +
			"Progress is served as " + contract.CloneProgressMetric + " over HTTPS; the outcome is written as JSON to the termination log.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := zap.New(zap.UseDevMode(verbose))
			ctrllog.SetLogger(log)
			fail := func(err error) error {
				text, permanent := err.Error(), true // a bad job description stays bad
				_ = contract.WriteTermination(terminationLog, contract.TerminationMessage{Outcome: contract.OutcomeFailed, Message: &text, Permanent: &permanent})
				return err
			}
			env := map[string]string{}
			f := cmd.Flags()
			for flag, name := range map[string]string{
				"volume-mode": cloner.EnvVolumeMode, "mount-point": cloner.EnvMountPoint, "upload-url": cloner.EnvUploadURL,
				"owner-uid": cloner.EnvOwnerUID, "server-ca-cert": cloner.EnvServerCACert, "client-cert": cloner.EnvClientCert,
				"client-key": cloner.EnvClientKey,
			} {
				if f.Changed(flag) {
					v, _ := f.GetString(flag)
					env[name] = v
				}
			}
			if f.Changed("preallocation") {
				env[cloner.EnvPreallocation] = strconv.FormatBool(prealloc)
			}
			job, err := cloner.JobFromEnv(func(k string) string {
				if v, ok := env[k]; ok {
					return v
				}
				return os.Getenv(k)
			})
			if err != nil {
				return fail(fmt.Errorf("clone job: %w", err))
			}
			if compressAll {
				job.Source.Compression = cloner.CompressAll
			}
			job.TerminationLog = terminationLog
			job.MetricsAddr = metricsAddr
			job.Log = log.WithName("cloner")
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return cloner.Run(ctx, job)
		},
	}
	f := cmd.Flags()
	f.StringVar(&mode, "volume-mode", "", "source volume mode, block or filesystem (default $"+cloner.EnvVolumeMode+")")
	f.StringVar(&mountPoint, "mount-point", "", "source mount point or device (default $"+cloner.EnvMountPoint+", else CDI's path for the mode)")
	f.StringVar(&uploadURL, "upload-url", "", "the target upload server's URL (default $"+cloner.EnvUploadURL+")")
	f.StringVar(&ownerUID, "owner-uid", "", "the target's UID, the progress metric's label (default $"+cloner.EnvOwnerUID+")")
	f.StringVar(&caFile, "server-ca-cert", "", "upload server CA, PEM or a file (default $"+cloner.EnvServerCACert+")")
	f.StringVar(&certFile, "client-cert", "", "client certificate, PEM or a file (default $"+cloner.EnvClientCert+")")
	f.StringVar(&kFile, "client-key", "", "client key, PEM or a file (default $"+cloner.EnvClientKey+")")
	f.BoolVar(&prealloc, "preallocation", false, "send files whole, holes as zeros (default $"+cloner.EnvPreallocation+")")
	f.BoolVar(&compressAll, "compress-all", false, "compress every block, as CDI does (for slow links); by default only blocks that shrink 8x or more")
	f.StringVar(&terminationLog, "termination-log", terminationLog, "where the JSON termination message is written")
	f.StringVar(&metricsAddr, "metrics-addr", metricsAddr, "address of the HTTPS progress endpoint; empty disables it")
	f.BoolVarP(&verbose, "verbose", "v", false, "verbose logging")
	return cmd
}
