// Package integration tests Kubefill against a real kube-apiserver and etcd,
// built from the Go module proxy by hack/testbin.sh and started once per
// package run through controller-runtime's envtest.
package integration

import (
	"context"

	"fmt"
	"go.uber.org/zap/zapcore"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"
)

var (
	// testEnv is the real control plane shared by every test in this package.
	testEnv *envtest.Environment
	// cfg reaches testEnv's kube-apiserver as a cluster admin.
	cfg *rest.Config
	// k8sClient is a typed client over scheme, as cluster admin.
	k8sClient client.Client
	// scheme knows the core Kubernetes types and Kubefill's API.
	scheme = k8sruntime.NewScheme()
)

// repoRoot is the top of the checkout, found from this file's location.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// controlPlaneAssets returns the directory holding kube-apiserver and etcd,
// building them through hack/testbin.sh (a cache hit after the first time)
// when KUBEBUILDER_ASSETS is not set.
func controlPlaneAssets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	cmd := exec.Command("bash", filepath.Join(repoRoot(), "hack", "testbin.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("building the control plane with hack/testbin.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func TestMain(m *testing.M) {
	os.Exit(runWithControlPlane(m))
}

func runWithControlPlane(m *testing.M) int {
	// Controllers under test log their errors; the rest stays quiet.
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	for _, add := range []func(*k8sruntime.Scheme) error{clientgoscheme.AddToScheme, cdiv1.AddToScheme, uploadv1.AddToScheme} {
		if err := add(scheme); err != nil {
			fmt.Fprintln(os.Stderr, "building scheme:", err)
			return 1
		}
	}
	assets, err := controlPlaneAssets()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	testEnv = &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(repoRoot(), "manifests", "crd")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
		// A loaded 2-core machine can take longer than envtest's 20 s default.
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	started := time.Now()
	cfg, err = testEnv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting kube-apiserver and etcd:", err)
		return 1
	}
	fmt.Printf("control plane from %s up with CRDs in %s\n", assets, time.Since(started).Round(time.Millisecond))
	defer func() {
		if err := testEnv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping control plane:", err)
		}
	}()
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, "building client:", err)
		return 1
	}
	code := m.Run()
	stopSharedClusterControllers()
	if err := stopHardenedControlPlane(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the hardened control plane:", err)
	}
	return code
}

// newNamespace creates a namespace with a generated name for one test and
// deletes it when the test ends.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kf-test-"}}
	if err := k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), ns) })
	return ns.Name
}

// cdiGVR is the GroupVersionResource of a cdi.kubevirt.io/v1beta1 resource.
func cdiGVR(resource string) schema.GroupVersionResource {
	return cdiv1.SchemeGroupVersion.WithResource(resource)
}

// ownEnvironment is a control plane of one test's own, not yet started,
// that installs our CRDs and the files in extraCRDs; the test configures
// its kube-apiserver further and starts it with startOwnControlPlane.
func ownEnvironment(t *testing.T, extraCRDs ...string) *envtest.Environment {
	t.Helper()
	assets, err := controlPlaneAssets()
	if err != nil {
		t.Fatal(err)
	}
	return &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     append([]string{filepath.Join(repoRoot(), "manifests", "crd")}, extraCRDs...),
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
		// Generous: on a loaded 2-core machine kube-apiserver can take well over
		// envtest's 20 s default, and a timed-out try leaves its process behind.
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
}

// startOwnControlPlane starts env, a control plane of one test's own (what
// describes it), stops it when the test ends, logs how long it took to
// start, and returns its config and a client.
func startOwnControlPlane(t *testing.T, env *envtest.Environment, what string) (*rest.Config, client.Client) {
	t.Helper()
	started := time.Now()
	envCfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting %s: %v", what, err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stopping control plane: %v", err)
		}
	})
	t.Logf("%s up in %s", what, time.Since(started).Round(time.Millisecond))
	envClient, err := client.New(envCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return envCfg, envClient
}

// useControlPlane points the helpers, which reach the control plane through
// cfg and k8sClient, at another one until the test's other cleanups have run.
func useControlPlane(t *testing.T, envCfg *rest.Config, envClient client.Client) {
	sharedCfg, sharedClient := cfg, k8sClient
	cfg, k8sClient = envCfg, envClient
	t.Cleanup(func() { cfg, k8sClient = sharedCfg, sharedClient })
}
