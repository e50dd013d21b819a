package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubefill/kubefill/pkg/controller"
)

// How the tests share the package's control plane side by side.
//
// A test that calls t.Parallel() first runs only after every serial test of
// the package has ended (go test's rule for top-level tests), so the serial
// ones may start cluster-wide managers and swap the shared control plane
// (useControlPlane) without a parallel test seeing either. A parallel test
// starts its controllers limited to its own namespaces
// (ManagerOptions.Namespaces, through runManager or startControllers), so
// that the managers of tests running at once never reconcile each other's
// objects. What a limited manager leaves out, the controllers of
// cluster-scoped objects (the StorageProfiles that DataVolumes are rendered
// from), runs once for all of them: sharedClusterControllers.

// clusterControllers is the package's one manager of cluster-scoped
// controllers, started by the first parallel test that needs it and stopped
// when the package's tests end.
var clusterControllers struct {
	once sync.Once
	err  error
	stop func()
}

// sharedClusterControllers makes sure the package's StorageProfile
// controller runs, for the namespace-limited managers of parallel tests.
func sharedClusterControllers(t *testing.T) {
	t.Helper()
	clusterControllers.once.Do(func() {
		mgr, err := ctrl.NewManager(cfg, ctrl.Options{
			Scheme:                 controller.NewScheme(),
			Metrics:                metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress: "0",
			Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		})
		if err != nil {
			clusterControllers.err = fmt.Errorf("building the shared cluster-scoped manager: %w", err)
			return
		}
		profiles := &controller.StorageProfileReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("storageprofile-controller")}
		if err := profiles.SetupWithManager(mgr); err != nil {
			clusterControllers.err = fmt.Errorf("registering the shared StorageProfile controller: %w", err)
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- mgr.Start(ctx) }()
		clusterControllers.stop = func() {
			cancel()
			if err := <-done; err != nil {
				fmt.Printf("the shared cluster-scoped manager stopped with: %v\n", err)
			}
		}
	})
	if clusterControllers.err != nil {
		t.Fatal(clusterControllers.err)
	}
}

// stopSharedClusterControllers ends what sharedClusterControllers started,
// if it did; TestMain calls it once the tests have ended.
func stopSharedClusterControllers() {
	if clusterControllers.stop != nil {
		clusterControllers.stop()
	}
}
