package integration

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// The hardened control plane is the package's second, for the tests that
// need what the shared one lacks: the snapshot CRDs, the ReferenceGrant CRD
// with the CrossNamespaceVolumeDataSource gate, and the
// OwnerReferencesPermissionEnforcement admission plugin (on in OpenShift and
// other hardened clusters: setting blockOwnerDeletion on an owner reference
// needs update on the owner's finalizers). One start serves them all: it
// starts with the first that asks and stops after the package's tests. Its
// tests point the helpers at it (useControlPlane), so they run one at a
// time, each in namespaces and classes of its own.
var hardened struct {
	once   sync.Once
	env    *envtest.Environment
	cfg    *rest.Config
	client client.Client
	err    error
}

// useHardenedControlPlane points the helpers at the hardened control plane
// until the test's other cleanups have run, starting it on first use.
func useHardenedControlPlane(t *testing.T) {
	t.Helper()
	hardened.once.Do(func() {
		// Until it is up: a helper below that fails the test ends this
		// function early, and the tests after it must not find a nil config.
		hardened.err = errors.New("the hardened control plane did not start: see the first test that used it")
		env := ownEnvironment(t, filepath.Join(repoRoot(), "tests", "integration", "testdata", "referencegrant-crd.yaml"))
		env.CRDDirectoryPaths = append(env.CRDDirectoryPaths, snapshotCRDPaths(t)...)
		gates := crossNamespaceGates(t, env.BinaryAssetsDirectory)
		api := env.ControlPlane.GetAPIServer().Configure()
		api.Set("feature-gates", gates)
		api.Set("enable-admission-plugins", "OwnerReferencesPermissionEnforcement")
		started := time.Now()
		hardened.cfg, hardened.err = env.Start()
		if hardened.err != nil {
			hardened.err = fmt.Errorf("starting the hardened control plane: %w", hardened.err)
			return
		}
		hardened.env = env
		hardened.client, hardened.err = client.New(hardened.cfg, client.Options{Scheme: scheme})
		if hardened.err != nil {
			return
		}
		t.Logf("hardened control plane (snapshot and ReferenceGrant CRDs, --feature-gates=%s, OwnerReferencesPermissionEnforcement) up in %s",
			gates, time.Since(started).Round(time.Millisecond))
	})
	if hardened.err != nil {
		t.Fatal(hardened.err)
	}
	useControlPlane(t, hardened.cfg, hardened.client)
}

// createClusterScoped creates a cluster-scoped object (a class, a profile)
// and deletes it when the test ends: the tests after it on the same control
// plane must not find it, as a clone's planner choosing among the classes
// of a driver would.
func createClusterScoped(t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	mustCreate(t, c, obj)
	t.Cleanup(func() { _ = c.Delete(context.Background(), obj) })
}

// stopHardenedControlPlane stops the hardened control plane if a test
// started it.
func stopHardenedControlPlane() error {
	if hardened.env == nil {
		return nil
	}
	return hardened.env.Stop()
}
