package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/populators"
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
	// SkipNameValidation lets tests run several managers in one process.
	SkipNameValidation bool
}

// NewManager builds the controller manager with every Kubefill controller
// registered, health and readiness checks, and metrics.
func NewManager(cfg *rest.Config, opts ManagerOptions) (ctrl.Manager, error) {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  NewScheme(),
		Metrics:                 metricsserver.Options{BindAddress: opts.MetricsBindAddress},
		HealthProbeBindAddress:  opts.HealthProbeBindAddress,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        opts.LeaderElectionID,
		LeaderElectionNamespace: opts.LeaderElectionNS,
		Controller:              config.Controller{SkipNameValidation: &opts.SkipNameValidation},
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
	if err := metrics.Registry.Register(pendingCollector{reader: mgr.GetClient()}); err != nil {
		var already prometheus.AlreadyRegisteredError
		if !errors.As(err, &already) {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	profiles := &StorageProfileReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("storageprofile-controller")}
	if err := profiles.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("registering the StorageProfile controller: %w", err)
	}
	configs := &CDIConfigReconciler{Client: mgr.GetClient(), UploadProxyURL: opts.UploadProxyURL, Recorder: mgr.GetEventRecorder("cdiconfig-controller")}
	if err := configs.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("registering the CDIConfig controller: %w", err)
	}
	dataVolumes := &DataVolumeReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("datavolume-controller")}
	if err := dataVolumes.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("registering the DataVolume controller: %w", err)
	}
	installNS := opts.InstallNamespace
	if installNS == "" {
		installNS = os.Getenv("POD_NAMESPACE")
	}
	uploadKind := &populators.UploadKind{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: installNS,
		Image: opts.WorkerImage, PullPolicy: opts.WorkerPullPolicy}
	kinds := populatorKinds(mgr.GetClient(), opts, uploadKind)
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
	if err := mgr.Add(register); err != nil {
		return nil, fmt.Errorf("adding VolumePopulator registration: %w", err)
	}
	if installNS != "" {
		// The upload proxy mounts its client certificate Secret: it must exist
		// before the first upload, not only once an upload pod is made.
		uploadPKI := manager.RunnableFunc(func(ctx context.Context) error {
			err := wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: time.Second, Factor: 2, Steps: 8, Cap: time.Minute}, func(ctx context.Context) (bool, error) {
				_, _, err := populators.EnsureUploadPKI(ctx, mgr.GetClient(), mgr.GetAPIReader(), installNS)
				if err != nil {
					ctrl.Log.WithName("setup").Error(err, "creating the upload CAs and the upload proxy's client certificate; retrying")
				}
				return err == nil, nil
			})
			if err != nil {
				ctrl.Log.WithName("setup").Error(err, "gave up creating the upload PKI at start; the upload populator creates it with the first upload")
			}
			return nil
		})
		if err := mgr.Add(uploadPKI); err != nil {
			return nil, fmt.Errorf("adding the upload PKI set-up: %w", err)
		}
	}
	return mgr, nil
}

// populatorKinds are the populator kinds the manager runs. The
// VolumePopulator objects are registered from this same list: a kind no
// populator runs is not declared, so the data-source validator warns about
// claims naming it instead of leaving them pending in silence.
func populatorKinds(c client.Client, opts ManagerOptions, upload *populators.UploadKind) []populators.Kind {
	return []populators.Kind{
		&populators.ImportKind{
			Client:      c,
			Image:       opts.WorkerImage,
			PullPolicy:  opts.WorkerPullPolicy,
			MetricsPort: contract.MetricsPort,
			MaxRetries:  3,
			Backoff:     10 * time.Second,
		},
		upload,
	}
}

// PopulatorKinds names the dataSourceRef kinds the manager fills, and
// declares through VolumePopulator objects.
func PopulatorKinds() []string {
	var names []string
	for _, k := range populatorKinds(nil, ManagerOptions{}, &populators.UploadKind{}) {
		names = append(names, k.Name())
	}
	return names
}

// populatorName names a kind's populator for its events: VolumeImportSource
// is the "import-populator".
func populatorName(kind string) string {
	return strings.TrimSuffix(strings.TrimPrefix(strings.ToLower(kind), "volume"), "source") + "-populator"
}
