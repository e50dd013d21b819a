package controller

import (
	"fmt"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// ManagerOptions are the settings of `kubefill controller`.
type ManagerOptions struct {
	MetricsBindAddress     string
	HealthProbeBindAddress string
	LeaderElection         bool
	LeaderElectionID       string
	LeaderElectionNS       string
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
	observer := &DataVolumeObserver{Client: mgr.GetClient()}
	if err := observer.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("registering the DataVolume observer: %w", err)
	}
	return mgr, nil
}
