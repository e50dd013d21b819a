// Package e2e holds end-to-end tests against one real local cluster per
// package run (see tests/cluster): real control plane, real CSI sidecars,
// our hostpath CSI driver, and a real node: kubelet, containerd, kube-proxy
// and CoreDNS running pods from images built here. One Kubefill stack
// serves them all (shared, started by TestMain).
//
// Tests run side by side: each works in namespaces of its own and calls
// parallel(t) (t.Parallel() and a share of clusterWide) first, except the
// serial group, which change what every other test sees:
//   - serialTests do not call t.Parallel(): go test runs a package's
//     top-level tests that do not first, one at a time and in order, and
//     only then the parallel ones (-parallel at once), so they never
//     overlap anything;
//   - the subtests in aloneSubtests are parts of a parallel test (whose
//     other subtests run side by side with everything) that call alone(t):
//     it waits until no other test runs and holds the others back until
//     the subtest ends.
//
// TestEveryTestParallelOrSerial holds every test to this.
package e2e

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kubefill/kubefill/tests/cluster"
)

// cl is the cluster every test in this package shares.
var cl *cluster.Cluster

// serialTests are the serial group, with what makes each one cluster-wide.
var serialTests = map[string]string{
	"TestKubeletRestartMidImport":       "restarts kubelet",
	"TestContainerdRestartMidImport":    "restarts containerd",
	"TestAPIServerRestartMidImport":     "restarts kube-apiserver",
	"TestCSINodePluginRestartMidImport": "restarts the CSI node plugin every volume is published through",
	"TestOOMKilledWorkerIsExplained":    "sets CDIConfig's pod limits",
	"TestImporterImportsUnder64MiLimit": "sets CDIConfig's pod limits",
	"TestUpload2GiBMemory":              "samples the shared upload proxy's and any upload server's memory",
	// Not cluster-wide, but timed: virtctl returns once the claim says its
	// upload pod Succeeded, and the DataVolume says Succeeded once the claim
	// is populated and Bound (the rebind, kube-controller-manager's binder);
	// the test wants both at once, a race the machine's load decides, lost
	// about every other run beside other tests.
	"TestVirtctlImageUpload": "checks the DataVolume the moment virtctl returns, a race only a quiet cluster wins",
	"TestCloneBenchmark":     "times clones against cp on a quiet machine",
	// Every worker pod started meanwhile would get its placement and pull secret.
	"TestImporterPodPlacedByTheCDIResource": "sets the CDI resource's spec.workload and CDIConfig's imagePullSecrets",
	"TestImportThroughInterceptingProxy":    "sets CDIConfig's importProxy, which every importer started meanwhile would use",
}

// aloneSubtests are the serial group's subtests of parallel tests, by the
// test they are in (which calls t.Parallel() itself, not parallel(t): it
// must not hold a share of clusterWide while its subtests wait for all of
// it), with what makes each cluster-wide.
var aloneSubtests = map[string]map[string]string{
	"TestCloneDataVolumes": {
		"CDICloneStrategyOverride": "sets the CDI resource's clone strategy override",
		"NoVolumeSnapshotClass":    "removes the snapshot classes",
	},
}

// clusterWide is held for reading by every parallel test while it runs
// (parallel) and for writing by the subtests that must run alone (alone).
// Go's RWMutex makes a waiting writer hold back new readers, so alone
// waits for the tests running, and the others wait for it.
var clusterWide sync.RWMutex

// parallel is a top-level test's first call: t.Parallel(), then a share of
// clusterWide until the test ends. Subtests call t.Parallel() instead.
func parallel(t *testing.T) {
	t.Parallel()
	t.Cleanup(slots.acquire(t.Name()))
	clusterWide.RLock()
	t.Cleanup(clusterWide.RUnlock)
}

// alone runs the rest of a subtest (one in aloneSubtests) with no other
// test beside it.
func alone(t *testing.T) {
	start := time.Now()
	clusterWide.Lock()
	t.Logf("running alone: waited %s for the other tests to end", time.Since(start).Round(time.Millisecond))
	t.Cleanup(clusterWide.Unlock)
}

func TestMain(m *testing.M) {
	os.Exit(cluster.RunMain(m, "e2e", cluster.Options{
		Storage: true,
		Node:    true,
		// Before kube-controller-manager starts, so that its garbage
		// collector follows DataVolumes from the first test on.
		KubefillCRDs: true,
	}, startShared))
}
