package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/kubefill/kubefill/pkg/uploadcli"
)

const uploadExamples = `  # Upload a qcow2 image into a new 10 GiB DataVolume, taking the proxy URL from CDIConfig:
  kubefill upload dv fedora --size=10Gi --image-path=Fedora-Cloud.qcow2

  # The same into a PVC filled by the upload populator, on block storage:
  kubefill upload pvc fedora --size=10Gi --image-path=Fedora-Cloud.qcow2 \
      --storage-class=csi-local --volume-mode=block --access-mode=ReadWriteOnce

  # Unpack a tar archive onto a Filesystem volume:
  kubefill upload dv app-data --size=2Gi --archive-path=data.tar

  # Upload into an existing DataVolume through an explicit proxy with its CA:
  kubefill upload dv fedora --no-create --image-path=disk.raw \
      --uploadproxy-url=https://upload.example.com:31001 --ca-cert=proxy-ca.crt`

func newUploadCommand() *cobra.Command {
	opts := uploadcli.Options{}
	var namespace string
	cmd := &cobra.Command{
		Use:   "upload dv|pvc NAME (--image-path=FILE | --archive-path=FILE) [--size=SIZE]",
		Short: "Upload a disk image or an archive from this machine into a DataVolume or PVC",
		Long: "Creates a DataVolume with source.upload (or a PVC whose dataSourceRef names a VolumeUploadSource),\n" +
			"requests an upload token (UploadTokenRequest), waits for the upload pod, streams the file to the\n" +
			"upload proxy with a progress bar, and waits until the data is written. Works the same against CDI,\n" +
			"with the flags of virtctl image-upload.",
		Example: uploadExamples,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := uploadcli.NormalizeKind(args[0])
			if err != nil {
				return err
			}
			opts.Kind, opts.Name = kind, args[1]
			if err := opts.Validate(); err != nil {
				return err
			}
			if namespace == "" {
				if namespace, err = kubeconfigNamespace(); err != nil {
					return err
				}
			}
			opts.Namespace = namespace
			cfg, err := config.GetConfig()
			if err != nil {
				return err
			}
			r, err := uploadcli.NewRunner(cfg, opts, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := r.Run(ctrl.SetupSignalHandler()); err != nil {
				return fmt.Errorf("upload into %s %s/%s: %w", args[0], namespace, opts.Name, err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	if kf := flag.CommandLine.Lookup("kubeconfig"); kf != nil {
		f.AddGoFlag(kf)
	}
	f.StringVarP(&namespace, "namespace", "n", "", "namespace of the DataVolume or PVC (default: the kubeconfig context's)")
	f.StringVar(&opts.ImagePath, "image-path", "", "disk image to upload (raw, qcow2, vmdk, vhd(x), vdi, iso; optionally gz/xz/zst compressed)")
	f.StringVar(&opts.ArchivePath, "archive-path", "", "tar archive to unpack onto a Filesystem volume")
	f.StringVar(&opts.Size, "size", "", "size of the new DataVolume or PVC, e.g. 10Gi")
	f.StringVar(&opts.StorageClass, "storage-class", "", "storage class of the new volume (default: the cluster's default class)")
	f.StringVar(&opts.AccessMode, "access-mode", "", "access mode of the new volume: ReadWriteOnce, ReadOnlyMany, ReadWriteMany or ReadWriteOncePod (default: from the StorageProfile for a DataVolume, ReadWriteOnce for a PVC)")
	f.StringVar(&opts.VolumeMode, "volume-mode", "", "volume mode of the new volume: block or filesystem")
	f.StringVar(&opts.ProxyURL, "uploadproxy-url", "", "upload proxy URL (default: CDIConfig spec.uploadProxyURLOverride, else status.uploadProxyURL)")
	f.BoolVar(&opts.Insecure, "insecure", false, "do not verify the upload proxy's certificate")
	f.StringVar(&opts.CACert, "ca-cert", "", "CA bundle (PEM) to verify the upload proxy's certificate with")
	f.BoolVar(&opts.NoCreate, "no-create", false, "upload into an existing DataVolume or PVC instead of creating one")
	f.BoolVar(&opts.ForceBind, "force-bind", false, "bind the volume at once, even if its storage class waits for a first consumer")
	f.IntVar(&opts.WaitSecs, "wait-secs", 300, "seconds to wait for the upload pod to be ready, and again for the upload to be processed")
	f.IntVar(&opts.Retry, "retry", 5, "attempts after a failed one (network errors, 502/503, an expired token)")
	return cmd
}

// kubeconfigNamespace is the namespace of the current kubeconfig context.
func kubeconfigNamespace() (string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kf := flag.CommandLine.Lookup("kubeconfig"); kf != nil && kf.Value.String() != "" {
		rules.ExplicitPath = kf.Value.String()
	}
	ns, _, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).Namespace()
	if err != nil {
		if os.Getenv("POD_NAMESPACE") != "" {
			return os.Getenv("POD_NAMESPACE"), nil
		}
		return "", fmt.Errorf("working out the namespace from the kubeconfig (or pass --namespace): %w", err)
	}
	return ns, nil
}
