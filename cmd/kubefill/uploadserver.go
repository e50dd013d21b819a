package main

import (
	"context"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/importer"
	"github.com/kubefill/kubefill/pkg/uploadserver"
)

// newUploadServerCommand runs the upload server inside an upload pod.
func newUploadServerCommand() *cobra.Command {
	cfg := uploadserver.Config{Addr: ":" + strconv.Itoa(contract.UploadServerPort), Paths: importer.DefaultPaths(), FilesystemOverhead: contract.DefaultFilesystemOverhead}
	var verbose bool
	var imageSize string
	cmd := &cobra.Command{
		Use:   "uploadserver",
		Short: "Receive an upload inside the upload pod",
		Long: "Serve CDI's upload API over mutual TLS (/v1beta1/upload, upload-async, upload-form, upload-form-async,\n" +
			"upload-archive, the v1alpha1 aliases and /healthz), write the one uploaded image to the volume through\n" +
			"the importer's data path, and exit 0 with a JSON termination message once it is on disk.\n" +
			"/metrics (no client certificate needed) publishes the share of the upload's body received, of its\n" +
			"Content-Length, as kubevirt_cdi_import_progress_total{ownerUID}; the controller shows it on the DataVolume.\n\n" +
			"With a clone's --client-name, <srcNs>/<srcName>-<tgtNs>/<tgtName>, it is the target of a host-assisted\n" +
			"clone: POST /v1beta1/upload with x-cdi-content-type blockdevice-clone or filesystem-clone, from a client\n" +
			"certificate of that common name, is the source pod's stream, written into the volume (the device at\n" +
			"--block-path when it is one, else the directory of --data-path); it exits 0 with \"Clone Complete\".",
		Example: "  kubefill uploadserver --tls-cert-file /certs/tls.crt --tls-key-file /certs/tls.key \\\n" +
			"    --client-ca-file /certs/client-ca.crt --client-name client.upload-server.cdi.kubevirt.io \\\n" +
			"    --image-size 10Gi --owner-uid $UID",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := zap.New(zap.UseDevMode(verbose))
			ctrllog.SetLogger(log)
			if imageSize != "" {
				q, err := resource.ParseQuantity(imageSize)
				if err != nil {
					return err
				}
				cfg.ImageSize = q.Value()
			}
			srv, err := uploadserver.New(cfg, log.WithName("uploadserver"))
			if err != nil {
				text, permanent := err.Error(), true
				_ = contract.WriteTermination(cfg.Paths.TerminationLog, contract.TerminationMessage{Outcome: contract.OutcomeFailed, Message: &text, Permanent: &permanent})
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return srv.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Addr, "listen", cfg.Addr, "TLS listen address")
	f.StringVar(&cfg.CertFile, "tls-cert-file", "", "serving certificate (PEM)")
	f.StringVar(&cfg.KeyFile, "tls-key-file", "", "serving key (PEM)")
	f.StringVar(&cfg.ClientCAFile, "client-ca-file", "", "CA bundle the upload proxy's client certificate must chain to")
	f.StringVar(&cfg.ClientName, "client-name", "", "common name the client certificate must have (required): the upload proxy's, or a clone's <srcNs>/<srcName>-<tgtNs>/<tgtName>, which makes this the target of that clone alone")
	f.StringVar(&cfg.ContentType, "content-type", "kubevirt", "content type of the volume: kubevirt or archive")
	f.StringVar(&imageSize, "image-size", "", "requested size of the volume, a Kubernetes quantity")
	f.Float64Var(&cfg.FilesystemOverhead, "filesystem-overhead", cfg.FilesystemOverhead, "fraction of a Filesystem volume kept free")
	f.BoolVar(&cfg.Preallocation, "preallocation", false, "preallocate the image")
	f.StringVar(&cfg.Checksum, "checksum", "", "\"algo:hex\" digest every upload must match")
	f.StringVar(&cfg.OwnerUID, "owner-uid", "", "ownerUID label of the progress metric")
	f.StringVar(&cfg.Paths.DataPath, "data-path", cfg.Paths.DataPath, "image file on a Filesystem volume")
	f.StringVar(&cfg.Paths.BlockPath, "block-path", cfg.Paths.BlockPath, "device of a Block volume (used when it exists)")
	f.StringVar(&cfg.Paths.ScratchDir, "scratch-dir", cfg.Paths.ScratchDir, "scratch directory for formats that need conversion")
	f.StringVar(&cfg.Paths.TerminationLog, "termination-log", cfg.Paths.TerminationLog, "where the JSON termination message is written")
	f.BoolVarP(&verbose, "verbose", "v", false, "verbose logging")
	return cmd
}
