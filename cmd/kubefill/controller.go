package main

import (
	"flag"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/controller"
)

// controllerGCPercent is the controller's GOGC unless the environment sets one.
const controllerGCPercent = 50

func newControllerCommand() *cobra.Command {
	opts := controller.ManagerOptions{LeaderElectionID: "kubefill-controller.cdi.kubevirt.io"}
	zapOpts := zap.Options{}
	cmd := &cobra.Command{
		Use:     "controller",
		Short:   "Run the Kubefill controllers",
		Long:    "Runs the controller manager: the DataVolume, StorageProfile and CDIConfig controllers, the import, upload and clone populators, and the upload-target controller that fills annotated claims in place.",
		Example: "  kubefill controller --kubeconfig ~/.kube/config --leader-elect=false",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
			if os.Getenv("GOGC") == "" {
				// The informers' cache is most of the heap and lives long;
				// the garbage between collections is mostly decoded objects
				// on their way into it. Collecting at half the live heap
				// instead of all of it keeps the resident set near 1.5x the
				// cache rather than 2x (10,000 claims and pods: ~150 MiB
				// instead of ~190), for little CPU once synced. GOGC wins.
				debug.SetGCPercent(controllerGCPercent)
			}
			cfg, err := config.GetConfig()
			if err != nil {
				return err
			}
			opts.Version = version
			mgr, err := controller.NewManager(cfg, opts)
			if err != nil {
				return err
			}
			ctrl.Log.WithName("setup").Info("starting controller manager", "version", version)
			return mgr.Start(ctrl.SetupSignalHandler())
		},
	}
	flags := cmd.Flags()
	// controller-runtime registers --kubeconfig on the standard flag set.
	flags.AddGoFlag(flag.CommandLine.Lookup("kubeconfig"))
	flags.StringVar(&opts.MetricsBindAddress, "metrics-bind-address", ":8080", "address the metrics endpoint binds to; 0 disables it")
	flags.StringVar(&opts.HealthProbeBindAddress, "health-probe-bind-address", ":8081", "address the health and readiness probes bind to")
	flags.BoolVar(&opts.LeaderElection, "leader-elect", true, "elect a leader so that only one replica reconciles at a time")
	flags.StringVar(&opts.LeaderElectionNS, "leader-election-namespace", "", "namespace of the leader-election lease (default: the pod's namespace)")
	flags.StringVar(&opts.WorkerImage, "worker-image", contract.DefaultImage, "image holding the kubefill binary that worker pods (importer, upload server) run")
	flags.StringVar((*string)(&opts.WorkerPullPolicy), "worker-pull-policy", string(corev1.PullIfNotPresent), "pull policy of the worker image, unless the CDI resource sets spec.imagePullPolicy")
	flags.StringVar(&opts.InstallNamespace, "install-namespace", "", "namespace holding Kubefill's own objects such as the upload CAs (default: $POD_NAMESPACE)")
	flags.StringVar(&opts.TokenKeyDir, "token-key-dir", "", "directory of the API server's mounted signing key Secret (id_rsa.pub), which clone tokens are checked with (default: read Secret --token-key-secret from the install namespace)")
	flags.StringVar(&opts.TokenKeySecret, "token-key-secret", "", "the API server's signing key Secret in the install namespace, read when --token-key-dir is empty (default kubefill-api-signing-key)")
	flags.StringVar(&opts.ExtendedTokenKeySecret, "extended-token-key-secret", "", "Secret in the install namespace keeping the controller's key for extended clone tokens, made at first use (default "+controller.DefaultExtendedTokenKeySecret+")")
	flags.StringVar(&opts.UploadProxyURL, "uploadproxy-url", "", "user-facing upload proxy URL published in CDIConfig status (spec.uploadProxyURLOverride wins)")
	flags.BoolVar(&opts.APIServerCertificates, "apiserver-certificates", true, "keep the API server's signer and serving certificate ("+certs.APIServerServerCert+") in the install namespace and inject its CA bundle into the APIService and the webhook configurations that point at --apiserver-service; false when cert-manager issues that certificate")
	flags.StringVar(&opts.APIServerService, "apiserver-service", certs.DefaultAPIServerService, "the API server's Service in the install namespace, which its serving certificate names")
	flags.StringVar(&opts.UploadProxyService, "uploadproxy-service", certs.DefaultUploadProxyService, "the upload proxy's Service in the install namespace, which its serving certificate ("+certs.UploadProxyServerCert+") names, with its cluster IPs")
	flags.DurationVar(&opts.CertPoll, "cert-poll-interval", certs.DefaultPoll, "check the certificates at least this often (they are also checked when one is due and when the CDI resource changes)")
	goFlags := flag.NewFlagSet("zap", flag.ContinueOnError)
	zapOpts.BindFlags(goFlags)
	flags.AddGoFlagSet(goFlags)
	return cmd
}
