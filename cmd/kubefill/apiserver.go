package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kubefill/kubefill/pkg/apiserver"
	"github.com/kubefill/kubefill/pkg/token"
)

func newAPIServerCommand() *cobra.Command {
	opts := apiserver.RunOptions{}
	zapOpts := zap.Options{}
	cmd := &cobra.Command{
		Use:   "apiserver",
		Short: "Serve the upload.cdi.kubevirt.io aggregated API and admission webhooks",
		Long: "Serves UploadTokenRequest (upload.cdi.kubevirt.io/v1beta1) behind kube-apiserver's aggregator,\n" +
			"and the DataVolume and populator admission webhooks, over one TLS port.\n" +
			"Callers are authenticated from kube-system/extension-apiserver-authentication and\n" +
			"authorised with SubjectAccessReviews. Tokens are signed with the key in the\n" +
			"<install-namespace>/<signing-key-secret> Secret, created on first start.",
		Example: "  kubefill apiserver --kubeconfig ~/.kube/config --install-namespace kubefill \\\n" +
			"      --tls-cert-file /etc/kubefill/tls/tls.crt --tls-private-key-file /etc/kubefill/tls/tls.key",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
			if opts.InstallNamespace == "" {
				opts.InstallNamespace = os.Getenv("POD_NAMESPACE")
			}
			if (opts.CertFile == "") != (opts.KeyFile == "") {
				return fmt.Errorf("--tls-cert-file and --tls-private-key-file go together")
			}
			if opts.SecurePort <= 0 || opts.SecurePort > 65535 {
				return fmt.Errorf("--secure-port %d is not a TCP port", opts.SecurePort)
			}
			cfg, err := config.GetConfig()
			if err != nil {
				return err
			}
			ctx := ctrl.SetupSignalHandler()
			ctrl.Log.WithName("setup").Info("starting apiserver", "version", version, "port", opts.SecurePort)
			return apiserver.Run(ctrl.LoggerInto(ctx, ctrl.Log), cfg, opts)
		},
	}
	flags := cmd.Flags()
	// controller-runtime registers --kubeconfig on the standard flag set.
	flags.AddGoFlag(flag.CommandLine.Lookup("kubeconfig"))
	flags.StringVar(&opts.BindAddress, "bind-address", "0.0.0.0", "address to listen on")
	flags.IntVar(&opts.SecurePort, "secure-port", 8443, "HTTPS port for the API and the webhooks")
	flags.StringVar(&opts.CertFile, "tls-cert-file", "", "serving certificate (PEM); reloaded when the file changes. Empty: generate a self-signed one")
	flags.StringVar(&opts.KeyFile, "tls-private-key-file", "", "private key of --tls-cert-file (PEM)")
	flags.StringSliceVar(&opts.GeneratedHosts, "generated-cert-hosts", []string{"kubefill-api.kubefill-system.svc", "localhost", "127.0.0.1"}, "DNS names and IPs of a generated serving certificate")
	flags.StringVar(&opts.GeneratedCAFile, "generated-ca-file", "", "write the CA of a generated serving certificate here (for a caBundle)")
	flags.StringVar(&opts.InstallNamespace, "install-namespace", "", "namespace of Kubefill's own objects, such as the signing key Secret (default: $POD_NAMESPACE)")
	flags.StringVar(&opts.SigningKeySecret, "signing-key-secret", token.DefaultSigningKeySecretName, "name of the Secret that holds the token signing key")
	flags.DurationVar(&opts.UploadTokenTTL, "token-lifetime", token.DefaultUploadTokenLifetime, "lifetime of upload tokens")
	flags.DurationVar(&opts.CloneTokenTTL, "clone-token-lifetime", token.DefaultCloneTokenLifetime, "lifetime of clone tokens added by the DataVolume webhook")
	flags.DurationVar(&opts.TokenLeeway, "token-leeway", token.DefaultCloneTokenLeeway, "clock skew validators allow; also extends how long a rotated-out key stays trusted")
	flags.DurationVar(&opts.AuthConfigTimeout, "authentication-config-timeout", time.Minute, "how long to wait for the first read of kube-system/extension-apiserver-authentication")
	flags.DurationVar(&opts.SigningKeyMaxAge, "signing-key-max-age", 0, "rotate the token signing key once it is this old (0: never); the previous key stays trusted for one token lifetime")
	flags.BoolVar(&opts.DisableWebhooks, "disable-admission-webhooks", false, "serve the aggregated API only")
	flags.StringVar(&opts.ControllerUser, "controller-user", "", "username of the Kubefill controller: the only identity that may change a DataVolume's extended clone token, and whose clone DataVolumes the webhooks authorise for their DataImportCron's ServiceAccount (default: system:serviceaccount:<install-namespace>:kubefill-controller)")
	flags.StringSliceVar(&opts.WebhookClientNames, "webhook-client-names", nil, "when set, the admission webhooks answer only callers with a client certificate that chains to the client CA or the request-header CA of kube-system/extension-apiserver-authentication and has one of these common names (kube-apiserver, given an AdmissionConfiguration kubeconfig; see docs/install.md); others get 401 or 403. Off by default")
	goFlags := flag.NewFlagSet("zap", flag.ContinueOnError)
	zapOpts.BindFlags(goFlags)
	flags.AddGoFlagSet(goFlags)
	return cmd
}
