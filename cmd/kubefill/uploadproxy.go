package main

import (
	"flag"
	"os"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/uploadproxy"
)

func newUploadProxyCommand() *cobra.Command {
	opts := uploadproxy.RunOptions{}
	zapOpts := zap.Options{}
	cmd := &cobra.Command{
		Use:   "uploadproxy",
		Short: "Authenticate uploads and proxy them to upload pods",
		Long: "Serves the user-facing upload endpoint (CDI's paths /v1beta1/upload, /v1beta1/upload-async,\n" +
			"/v1beta1/upload-form, /v1beta1/upload-form-async, /v1beta1/upload-archive and their v1alpha1 aliases).\n" +
			"Each upload carries \"Authorization: Bearer <token>\" from an UploadTokenRequest; the proxy checks the\n" +
			"PS256 token against the mounted signing key, finds the claim's upload pod (through its PVC-prime),\n" +
			"waits a bounded time for it to be ready, and streams the body to it over mutual TLS without buffering.",
		Example: "  kubefill uploadproxy --kubeconfig ~/.kube/config --signing-key-dir /var/run/kubefill/signing-key \\\n" +
			"      --tls-cert-file /etc/kubefill/tls/tls.crt --tls-private-key-file /etc/kubefill/tls/tls.key \\\n" +
			"      --client-cert-file /etc/kubefill/client/tls.crt --client-key-file /etc/kubefill/client/tls.key \\\n" +
			"      --upload-server-ca-file /etc/kubefill/upload-server-ca/ca.crt",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Namespace == "" {
				opts.Namespace = os.Getenv("POD_NAMESPACE")
			}
			if err := opts.Validate(); err != nil {
				return err
			}
			ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
			cfg, err := config.GetConfig()
			if err != nil {
				return err
			}
			ctx := ctrl.SetupSignalHandler()
			ctrl.Log.WithName("setup").Info("starting uploadproxy", "version", version, "port", opts.SecurePort)
			return uploadproxy.Run(ctrl.LoggerInto(ctx, ctrl.Log), cfg, opts)
		},
	}
	flags := cmd.Flags()
	// controller-runtime registers --kubeconfig on the standard flag set.
	flags.AddGoFlag(flag.CommandLine.Lookup("kubeconfig"))
	flags.StringVar(&opts.BindAddress, "bind-address", "0.0.0.0", "address to listen on")
	flags.IntVar(&opts.SecurePort, "secure-port", 8443, "HTTPS port users upload to")
	flags.StringVar(&opts.CertFile, "tls-cert-file", "", "serving certificate (PEM); reloaded when the file changes. Empty: generate a self-signed one")
	flags.StringVar(&opts.KeyFile, "tls-private-key-file", "", "private key of --tls-cert-file (PEM)")
	flags.StringSliceVar(&opts.GeneratedHosts, "generated-cert-hosts", []string{"kubefill-uploadproxy.kubefill-system.svc", "localhost", "127.0.0.1"}, "DNS names and IPs of a generated serving certificate")
	flags.StringVar(&opts.SigningKeyDir, "signing-key-dir", "", "directory of the mounted token signing key Secret (id_rsa.pub, id_rsa.pub.previous, rotated-at)")
	flags.DurationVar(&opts.TokenLeeway, "token-leeway", 10*time.Second, "clock skew allowed when checking a token's exp, nbf and iat")
	flags.StringVar(&opts.Upstream.ClientCertFile, "client-cert-file", "", "client certificate (PEM) the proxy presents to upload servers")
	flags.StringVar(&opts.Upstream.ClientKeyFile, "client-key-file", "", "private key of --client-cert-file (PEM)")
	flags.StringVar(&opts.Upstream.CAFile, "upload-server-ca-file", "", "CA bundle (PEM) that signs upload servers' serving certificates")
	flags.StringVar(&opts.UploadServerCAConfigMap, "upload-server-ca-configmap", "", "ConfigMap in the install namespace ($POD_NAMESPACE) whose ca-bundle.crt is trusted for upload servers too, read through the API (cdi-uploadserver-signer-bundle): a rotated signer is trusted before kubelet updates the mounted --upload-server-ca-file")
	flags.StringVar(&opts.Upstream.ServerName, "upload-server-name", "", "name to verify in every upload server's certificate (default: the upload Service's <service>.<namespace>.svc, cdi-upload-<claim> when that is a DNS-1035 label)")
	flags.StringVar(&opts.Address, "upload-server-address", uploadproxy.AddressPodIP, "how to reach upload pods: pod-ip (read the pod's IP; no cluster DNS needed) or service (the upload Service, <service>.<namespace>.svc)")
	flags.IntVar(&opts.UpstreamPort, "upload-server-port", contract.UploadServerPort, "port of the upload server (the pod port with pod-ip, the Service port with service)")
	flags.DurationVar(&opts.PodWait, "pod-ready-timeout", 60*time.Second, "how long an upload waits for its upload pod to become ready before 503")
	goFlags := flag.NewFlagSet("zap", flag.ContinueOnError)
	zapOpts.BindFlags(goFlags)
	flags.AddGoFlagSet(goFlags)
	return cmd
}
