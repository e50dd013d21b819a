package controller

import (
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/pkg/clone"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/pkg/token"
)

// ManagerOptions are the settings of `kubefill controller`.
type ManagerOptions struct {
	MetricsBindAddress     string
	HealthProbeBindAddress string
	LeaderElection         bool
	LeaderElectionID       string
	LeaderElectionNS       string
	// WorkerImage is the image holding the kubefill binary that worker pods run.
	WorkerImage string
	// WorkerPullPolicy is the worker image's pull policy.
	WorkerPullPolicy corev1.PullPolicy
	// UploadProxyURL is published in CDIConfig status unless the spec overrides it.
	UploadProxyURL string
	// InstallNamespace holds Kubefill's own objects, such as the upload CAs
	// (default: $POD_NAMESPACE).
	InstallNamespace string
	// TokenKeyDir holds the API server's token public keys (the mounted
	// kubefill-api-signing-key Secret's id_rsa.pub, id_rsa.pub.previous,
	// rotated-at), which short clone tokens (issuer cdi-apiserver) are
	// checked with. Empty reads that Secret (TokenKeySecret) from the
	// install namespace instead.
	TokenKeyDir string
	// TokenKeySecret is the API server's signing key Secret in the install
	// namespace, read when TokenKeyDir is empty; empty is
	// token.DefaultSigningKeySecretName.
	TokenKeySecret string
	// ExtendedTokenKeySecret keeps the controller's own key for extended
	// clone tokens (issuer cdi-deployment) in the install namespace, made at
	// first use; empty is DefaultExtendedTokenKeySecret.
	ExtendedTokenKeySecret string
	// APIServerCertificates makes the controller keep the API server's
	// signer and serving certificate (certs.APIServerServerCert) and inject
	// its CA bundle into the APIService and the webhook configurations that
	// point at APIServerService. Off where something else serves or
	// certifies the API (cert-manager, a test harness).
	APIServerCertificates bool
	// APIServerService and UploadProxyService name the Services in the
	// install namespace the serving certificates are for; empty are
	// certs.DefaultAPIServerService and certs.DefaultUploadProxyService.
	APIServerService, UploadProxyService string
	// CertPoll bounds the wait between certificate checks; zero is a minute.
	CertPoll time.Duration
	// SkipNameValidation lets tests run several managers in one process.
	SkipNameValidation bool
	// Namespaces, when set, limits the manager to these namespaces and the
	// install namespace: it caches, and so reconciles, the namespaced
	// objects of these only, and runs none of the controllers of
	// cluster-scoped objects (StorageProfiles, CDIConfig, the CDI resource,
	// the VolumePopulator registrations), which a cluster-wide manager
	// keeps. It is for a second controller beside one that leaves these
	// namespaces out (ExcludeNamespaces), as the e2e tests that stop and
	// restart a controller run one.
	Namespaces []string
	// ExcludeNamespaces leaves the namespaced objects of these namespaces to
	// another manager (see Namespaces); not together with Namespaces.
	ExcludeNamespaces []string
	// Version is this build's version, reported on the CDI resource
	// (operatorVersion, targetVersion, observedVersion).
	Version string
}

// DefaultExtendedTokenKeySecret is the Secret of the controller's extended
// clone token key.
const DefaultExtendedTokenKeySecret = "kubefill-controller-token-key"

// NewManager builds the controller manager with every Kubefill controller
// registered, health and readiness checks, and metrics.
func NewManager(cfg *rest.Config, opts ManagerOptions) (ctrl.Manager, error) {
	installNS := opts.InstallNamespace
	if installNS == "" {
		installNS = os.Getenv("POD_NAMESPACE")
	}
	namespaces, err := cacheNamespaces(installNS, opts.Namespaces, opts.ExcludeNamespaces)
	if err != nil {
		return nil, err
	}
	// A manager limited to some namespaces leaves cluster-scoped objects to
	// the cluster-wide one.
	clusterWide := len(opts.Namespaces) == 0
	cacheOpts := managerCache(installNS)
	cacheOpts.DefaultNamespaces = namespaces
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Cache:                   cacheOpts,
		Scheme:                  NewScheme(),
		Metrics:                 metricsserver.Options{BindAddress: opts.MetricsBindAddress},
		HealthProbeBindAddress:  opts.HealthProbeBindAddress,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        opts.LeaderElectionID,
		LeaderElectionNamespace: opts.LeaderElectionNS,
		// The process ends when the manager does, so a stopping replica
		// hands the lease over at once: a rolling update waits for the new
		// pod's start, not for the old lease to expire (15 s).
		LeaderElectionReleaseOnCancel: true,
		Controller:                    config.Controller{SkipNameValidation: &opts.SkipNameValidation},
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding readiness check: %w", err)
	}
	for _, c := range append([]prometheus.Collector{pendingCollector{reader: mgr.GetClient()}, restartCollector{reader: mgr.GetClient()}}, CDICollectors()...) {
		if err := metrics.Registry.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return nil, fmt.Errorf("registering metrics: %w", err)
			}
		}
	}
	if clusterWide {
		if err := setupClusterScoped(mgr, opts, installNS); err != nil {
			return nil, err
		}
	}
	tokens, err := cloneTokens(cfg, mgr, opts, installNS)
	if err != nil {
		return nil, err
	}
	dataVolumes := &DataVolumeReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("datavolume-controller"),
		CloneTokens: tokens.short, ExtendedTokens: tokens.extendedGenerator, ExtendedTokenValidator: tokens.extended}
	if err := dataVolumes.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("registering the DataVolume controller: %w", err)
	}
	if err := (&DataSourceReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("registering the DataSource controller: %w", err)
	}
	crons := &DataImportCronReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("dataimportcron-controller"),
		Namespace: installNS, Image: opts.WorkerImage, PullPolicy: opts.WorkerPullPolicy}
	if err := crons.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("registering the DataImportCron controller: %w", err)
	}
	uploadKind := &populators.UploadKind{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: installNS,
		Image: opts.WorkerImage, PullPolicy: opts.WorkerPullPolicy}
	snapshots, err := kindServed(mgr, volumeSnapshotGVK)
	if err != nil {
		return nil, err
	}
	if snapshots && !mgr.GetScheme().Recognizes(volumeSnapshotGVK) {
		if err := snapshotv1.AddToScheme(mgr.GetScheme()); err != nil {
			return nil, fmt.Errorf("adding snapshot.storage.k8s.io/v1 to the scheme: %w", err)
		}
	}
	cloneKind := &clone.Kind{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: installNS,
		Image: opts.WorkerImage, PullPolicy: opts.WorkerPullPolicy, ExtendedTokens: tokens.extended,
		Grants: &populators.GrantChecker{Reader: mgr.GetAPIReader()}, Snapshots: snapshots}
	kinds := populatorKinds(mgr.GetClient(), mgr.GetAPIReader(), installNS, opts, uploadKind, cloneKind)
	var kindNames []string
	for _, kind := range kinds {
		r := &populators.Reconciler{
			Client:   mgr.GetClient(),
			Recorder: mgr.GetEventRecorder(populatorName(kind.Name())),
			Events:   mgr.GetAPIReader(),
			Grants:   &populators.GrantChecker{Reader: mgr.GetAPIReader()},
			Kind:     kind,
		}
		if err := r.SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("registering the %s populator: %w", kind.Name(), err)
		}
		if kind == populators.Kind(uploadKind) {
			// CDI's older upload flow, still used by `virtctl image-upload pvc`.
			if err := (&populators.UploadTargetReconciler{Populator: r}).SetupWithManager(mgr); err != nil {
				return nil, fmt.Errorf("registering the upload-target controller: %w", err)
			}
		}
		kindNames = append(kindNames, kind.Name())
	}
	register := manager.RunnableFunc(func(ctx context.Context) error {
		if err := populators.RegisterVolumePopulators(ctx, mgr.GetClient(), kindNames); err != nil {
			ctrl.Log.WithName("setup").Error(err, "registering VolumePopulators")
		}
		return nil
	})
	if clusterWide {
		if err := mgr.Add(register); err != nil {
			return nil, fmt.Errorf("adding VolumePopulator registration: %w", err)
		}
	}
	if installNS != "" {
		// CDI's certificate chains, kept and rotated in the install namespace
		// (the upload proxy mounts its client certificate: it must exist
		// before the first upload, not only once an upload pod is made).
		rot := &certs.Rotator{Store: certs.Store{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: installNS},
			APIServer: opts.APIServerCertificates, APIServerService: opts.APIServerService, UploadProxyService: opts.UploadProxyService}
		r := &certs.Reconciler{Rotator: rot, Recorder: mgr.GetEventRecorder("certificate-controller"), Poll: opts.CertPoll}
		if err := r.SetupWithManager(mgr); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// setupClusterScoped registers the controllers of cluster-scoped objects:
// StorageProfiles, the CDIConfig and, with an install namespace, the CDI
// resource.
func setupClusterScoped(mgr ctrl.Manager, opts ManagerOptions, installNS string) error {
	profiles := &StorageProfileReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("storageprofile-controller")}
	if err := profiles.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("registering the StorageProfile controller: %w", err)
	}
	configs := &CDIConfigReconciler{Client: mgr.GetClient(), UploadProxyURL: opts.UploadProxyURL, Recorder: mgr.GetEventRecorder("cdiconfig-controller")}
	if err := configs.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("registering the CDIConfig controller: %w", err)
	}
	if installNS != "" {
		cdis := &CDIReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("cdi-operator"),
			Namespace: installNS, Version: versionOr(opts.Version)}
		if err := cdis.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("registering the CDI controller: %w", err)
		}
	}
	return nil
}

// populatorKinds are the populator kinds the manager runs. The
// VolumePopulator objects are registered from this same list: a kind no
// populator runs is not declared, so the data-source validator warns about
// claims naming it instead of leaving them pending in silence.
func populatorKinds(c client.Client, reader client.Reader, installNS string, opts ManagerOptions, upload *populators.UploadKind, cloneKind *clone.Kind) []populators.Kind {
	return []populators.Kind{
		&populators.ImportKind{
			Client:      c,
			Reader:      reader,
			Namespace:   installNS,
			Image:       opts.WorkerImage,
			PullPolicy:  opts.WorkerPullPolicy,
			MetricsPort: contract.MetricsPort,
			MaxRetries:  int32(populators.WorkerRetry.MaxRetries),
			Backoff:     populators.WorkerRetry.Backoff,
			MaxBackoff:  populators.WorkerRetry.MaxBackoff,
		},
		upload,
		cloneKind,
	}
}

// PopulatorKinds names the dataSourceRef kinds the manager fills, and
// declares through VolumePopulator objects.
func PopulatorKinds() []string {
	var names []string
	for _, k := range populatorKinds(nil, nil, "", ManagerOptions{}, &populators.UploadKind{}, &clone.Kind{}) {
		names = append(names, k.Name())
	}
	return names
}

// populatorName names a kind's populator for its events: VolumeImportSource
// is the "import-populator".
func populatorName(kind string) string {
	return strings.TrimSuffix(strings.TrimPrefix(strings.ToLower(kind), "volume"), "source") + "-populator"
}

// cloneTokenKeys are the controller's clone token validators and the
// extended token's generator; nil where no key is configured.
type cloneTokenKeys struct {
	short, extended   token.Validator
	extendedGenerator token.Generator
}

// cloneTokens builds them: short tokens are checked with the API server's
// public keys (the mounted Secret in opts.TokenKeyDir, else that Secret read
// from the install namespace), extended tokens with the controller's own key,
// kept in a Secret of the install namespace and made at first use.
func cloneTokens(cfg *rest.Config, mgr ctrl.Manager, opts ManagerOptions, installNS string) (cloneTokenKeys, error) {
	var keys cloneTokenKeys
	window := token.DefaultCloneTokenLifetime + token.DefaultCloneTokenLeeway
	// Secrets are read uncached (the controller may not list them), with a
	// client of their own so that no informer on Secrets starts.
	direct, err := client.New(cfg, client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return keys, fmt.Errorf("creating the token key client: %w", err)
	}
	switch {
	case opts.TokenKeyDir != "":
		dir := &token.DirKeySource{Dir: opts.TokenKeyDir, Window: window}
		keys.short = token.NewMultiKeyValidator(token.CloneTokenIssuer, dir.PublicKeys, token.DefaultCloneTokenLeeway)
	case installNS != "":
		name := opts.TokenKeySecret
		if name == "" {
			name = token.DefaultSigningKeySecretName
		}
		src := &token.SecretKeySource{Client: direct, Namespace: installNS, Name: name, Window: window, PublicOnly: true}
		keys.short = token.NewMultiKeyValidator(token.CloneTokenIssuer, src.PublicKeys, token.DefaultCloneTokenLeeway)
	}
	if installNS != "" {
		name := opts.ExtendedTokenKeySecret
		if name == "" {
			name = DefaultExtendedTokenKeySecret
		}
		ext := &ensuredKeys{c: direct, namespace: installNS, name: name, window: window}
		keys.extended = token.NewMultiKeyValidator(token.ExtendedCloneTokenIssuer, ext.PublicKeys, token.DefaultCloneTokenLeeway)
		keys.extendedGenerator = token.NewDynamicGenerator(token.ExtendedCloneTokenIssuer, ext.PrivateKey, token.DefaultExtendedCloneTokenLifetime)
	}
	return keys, nil
}

// ensuredKeys is a signing key Secret made at first use (replicas converge
// on the first one made), then followed for rotations.
type ensuredKeys struct {
	c               client.Client
	namespace, name string
	window          time.Duration

	mu  sync.Mutex
	src *token.SecretKeySource
}

func (e *ensuredKeys) source() (*token.SecretKeySource, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.src != nil {
		return e.src, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ks, err := token.EnsureSigningKeySecret(ctx, e.c, e.namespace, e.name)
	if err != nil {
		return nil, err
	}
	e.src = token.NewSecretKeySource(e.c, e.namespace, e.name, ks, e.window)
	return e.src, nil
}

// PrivateKey is a token.PrivateKeyFunc.
func (e *ensuredKeys) PrivateKey() (*rsa.PrivateKey, error) {
	src, err := e.source()
	if err != nil {
		return nil, err
	}
	return src.PrivateKey()
}

// PublicKeys is a token.PublicKeysFunc.
func (e *ensuredKeys) PublicKeys() ([]*rsa.PublicKey, error) {
	src, err := e.source()
	if err != nil {
		return nil, err
	}
	return src.PublicKeys()
}
