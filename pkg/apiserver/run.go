package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"

	"github.com/kubefill/kubefill/pkg/apiserver/admission"
	"github.com/kubefill/kubefill/pkg/token"
)

// RunOptions configure the whole `kubefill apiserver` process.
type RunOptions struct {
	Options
	// InstallNamespace holds the signing key Secret.
	InstallNamespace  string
	SigningKeySecret  string
	UploadTokenTTL    time.Duration
	CloneTokenTTL     time.Duration
	TokenLeeway       time.Duration
	DisableWebhooks   bool
	AuthConfigTimeout time.Duration
	// SigningKeyMaxAge > 0 rotates the signing key once it is that old.
	SigningKeyMaxAge time.Duration
	// ControllerUser is the user name of `kubefill controller`: the only
	// identity that may change a DataVolume's extended clone token, and
	// whose clone DataVolumes are authorised for their DataImportCron's
	// ServiceAccount; empty is admission.DefaultControllerUser(InstallNamespace).
	ControllerUser string
	// WebhookClientNames, when set, limits the webhook paths to callers
	// with a client certificate of one of these common names (Config).
	WebhookClientNames []string
}

// NewScheme knows the core types and Kubefill's API.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, cdiv1.AddToScheme, uploadv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Run starts the aggregated API server and the webhooks and serves until ctx ends.
func Run(ctx context.Context, restCfg *rest.Config, opts RunOptions) error {
	log := logf.FromContext(ctx).WithName("apiserver")
	if opts.InstallNamespace == "" {
		return errors.New("the install namespace is required (--install-namespace or POD_NAMESPACE)")
	}
	if opts.SigningKeySecret == "" {
		opts.SigningKeySecret = token.DefaultSigningKeySecretName
	}
	if opts.ControllerUser == "" {
		opts.ControllerUser = admission.DefaultControllerUser(opts.InstallNamespace)
	}
	if opts.UploadTokenTTL <= 0 || opts.CloneTokenTTL <= 0 {
		return fmt.Errorf("token lifetimes must be positive (upload %s, clone %s)", opts.UploadTokenTTL, opts.CloneTokenTTL)
	}
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("building Kubernetes client: %w", err)
	}
	scheme, err := NewScheme()
	if err != nil {
		return err
	}
	cl, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("building client: %w", err)
	}

	auth := &AuthSource{}
	if err := WatchAuthConfig(logf.IntoContext(ctx, log), kube, auth, orDuration(opts.AuthConfigTimeout, time.Minute)); err != nil {
		return err
	}
	if auth.Get() == nil {
		log.Info("authentication ConfigMap not present yet; every API request gets 401 until it appears",
			"configmap", AuthConfigMapNamespace+"/"+AuthConfigMapName)
	}

	keys, err := token.EnsureSigningKeySecret(ctx, cl, opts.InstallNamespace, opts.SigningKeySecret)
	if err != nil {
		return err
	}
	log.Info("token signing key loaded", "secret", opts.InstallNamespace+"/"+opts.SigningKeySecret, "kid", token.KeyID(keys.Current))
	// After a rotation the previous key stays trusted for the longest token lifetime plus the leeway.
	window := max(opts.UploadTokenTTL, opts.CloneTokenTTL) + opts.TokenLeeway
	ks := token.NewSecretKeySource(cl, opts.InstallNamespace, opts.SigningKeySecret, keys, window)
	if opts.SigningKeyMaxAge > 0 {
		if opts.SigningKeyMaxAge <= window {
			return fmt.Errorf("signing key max age %s must be longer than the trust window of a rotated-out key (%s)", opts.SigningKeyMaxAge, window)
		}
		go rotateSigningKeyPeriodically(ctx, cl, opts.InstallNamespace, opts.SigningKeySecret, opts.SigningKeyMaxAge, window)
	}

	webhooks := map[string]http.Handler{}
	if !opts.DisableWebhooks {
		cloneTokens := token.NewDynamicGenerator(token.CloneTokenIssuer, ks.PrivateKey, opts.CloneTokenTTL)
		webhooks[admission.PathDataVolumeValidate] = admission.Handler("datavolume-validate", (&admission.DataVolumeValidator{Client: cl, ControllerUser: opts.ControllerUser}).Admit)
		webhooks[admission.PathDataVolumeMutate] = admission.Handler("datavolume-mutate", (&admission.DataVolumeMutator{Client: cl, Tokens: cloneTokens, ControllerUser: opts.ControllerUser}).Admit)
		webhooks[admission.PathPopulatorValidate] = admission.Handler("populator-validate", admission.AdmitPopulator)
		webhooks[admission.PathCDIValidate] = admission.Handler("cdi-validate", (&admission.CDIValidator{Client: cl}).Admit)
		webhooks[admission.PathDataImportCronValidate] = admission.Handler("dataimportcron-validate", (&admission.DataImportCronValidator{Client: cl}).Admit)
	}
	if len(opts.WebhookClientNames) > 0 {
		log.Info("admission webhooks answer only kube-apiserver's client certificate", "names", opts.WebhookClientNames)
	}
	srv, err := NewServer(Config{
		Kube:         kube,
		Auth:         auth,
		Authorizer:   SARAuthorizer{Client: kube},
		UploadTokens: token.NewDynamicGenerator(token.UploadTokenIssuer, ks.PrivateKey, opts.UploadTokenTTL),
		Webhooks:     webhooks,
		// Off by default, so that a cluster whose kube-apiserver presents
		// no client certificate to webhooks (CDI needs none) keeps working.
		WebhookClientNames: opts.WebhookClientNames,
		Ready: func() error {
			_, err := ks.PrivateKey()
			return err
		},
	})
	if err != nil {
		return err
	}
	tlsCfg, err := TLSConfig(opts.Options)
	if err != nil {
		return err
	}
	return srv.Serve(ctx, opts.Options, tlsCfg)
}

func orDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func rotateSigningKeyPeriodically(ctx context.Context, c client.Client, namespace, name string, maxAge, window time.Duration) {
	log := logf.FromContext(ctx).WithName("signing-key")
	every := min(max(maxAge/4, time.Second), 10*time.Minute)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := token.RotateIfOlder(ctx, c, namespace, name, maxAge, window); err != nil && ctx.Err() == nil {
			log.Error(err, "rotating the token signing key; will retry", "in", every)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
