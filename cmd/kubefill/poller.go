package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/datapath/source"
	"github.com/kubefill/kubefill/pkg/poller"
)

// pollerFlags are CDI's cdi-source-update-poller flags, spelt as it spells
// them (-ns, -cron, -url, -certdir), so a CronJob written for CDI's poller
// runs this one unchanged.
type pollerFlags struct {
	kubeconfig, server         string
	namespace, cron, url, cert string
	timeout                    time.Duration
}

func parsePollerFlags(args []string, out io.Writer) (*pollerFlags, error) {
	p := &pollerFlags{}
	fs := flag.NewFlagSet("kubefill poller", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&p.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default: in-cluster)")
	fs.StringVar(&p.server, "server", "", "URL of the API server (default: the kubeconfig's, or in-cluster)")
	fs.StringVar(&p.namespace, "ns", "", "DataImportCron namespace")
	fs.StringVar(&p.cron, "cron", "", "DataImportCron name")
	fs.StringVar(&p.url, "url", "", "registry source URL (docker://registry/repo[:tag])")
	fs.StringVar(&p.cert, "certdir", "", "directory of extra CA certificates (PEM) for the registry")
	fs.DurationVar(&p.timeout, "timeout", 2*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if p.namespace == "" || p.cron == "" || p.url == "" {
		return nil, fmt.Errorf("-ns, -cron and -url are required (got -ns %q -cron %q -url %q)", p.namespace, p.cron, p.url)
	}
	return p, nil
}

// newPollerCommand is what a DataImportCron's CronJob runs: one poll of a
// registry image's digest, recorded on the cron. Credentials come from
// IMPORTER_ACCESS_KEY_ID and IMPORTER_SECRET_KEY, INSECURE_TLS=true skips
// certificate checks, IMPORTER_PROXY_CERT_DIR holds the import proxy's CA,
// as for CDI's poller.
func newPollerCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "poller -ns <namespace> -cron <name> -url <docker://...> [-certdir <dir>]",
		Short: "Record a registry image's current digest on a DataImportCron",
		Long: "Read the top-level manifest digest of a registry image and record it on a DataImportCron\n" +
			"(annotations cdi.kubevirt.io/storage.import.lastCronTime and, when it changed,\n" +
			"cdi.kubevirt.io/storage.import.sourceDesiredDigest), as CDI's cdi-source-update-poller does.\n" +
			"Credentials: $" + contract.EnvAccessKeyID + " and $" + contract.EnvSecretKey + "; $" + contract.EnvInsecureTLS + "=true skips TLS checks.",
		// CDI's single-dash flags (-ns is not -n -s) are parsed by the
		// standard flag package.
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, a := range args {
				if a == "-h" || a == "-help" || a == "--help" {
					return cmd.Help()
				}
			}
			p, err := parsePollerFlags(args, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			log := zap.New()
			ctrllog.SetLogger(log)
			insecure := false
			if v := os.Getenv(contract.EnvInsecureTLS); v != "" {
				if insecure, err = strconv.ParseBool(v); err != nil {
					return fmt.Errorf("%s=%q: %w", contract.EnvInsecureTLS, v, err)
				}
			}
			ca, err := source.LoadPEMDir(p.cert)
			if err != nil {
				return err
			}
			// A TLS-intercepting proxy presents certificates of its own CA
			// for the registry.
			proxyCA, err := source.LoadPEMDir(os.Getenv(contract.EnvProxyCertDir))
			if err != nil {
				return fmt.Errorf("reading the import proxy's CA (%s): %w", contract.EnvProxyCertDir, err)
			}
			ca = append(ca, proxyCA...)
			cfg, err := clientcmd.BuildConfigFromFlags(p.server, p.kubeconfig)
			if err != nil {
				return fmt.Errorf("building the API client configuration: %w", err)
			}
			// The registry may need a proxy; the API server does not.
			cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
			c, err := client.New(cfg, client.Options{Scheme: controller.NewScheme()})
			if err != nil {
				return fmt.Errorf("creating the API client: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), p.timeout)
			defer cancel()
			_, _, err = poller.Run(ctx, c, poller.Job{Namespace: p.namespace, Cron: p.cron, Registry: poller.Registry{
				URL: p.url, CAPEM: ca, InsecureTLS: insecure,
				Username: os.Getenv(contract.EnvAccessKeyID), Password: os.Getenv(contract.EnvSecretKey),
			}}, time.Now, log.WithName("poller"))
			return err
		},
	}
}
