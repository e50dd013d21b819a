package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/apiserver/admission"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/cluster"
)

// shared is the Kubefill every test uses, started once by TestMain: the
// controller manager in this process, for every namespace but the own
// ones (ownNamespaceCounts); `kubefill apiserver` with its admission
// webhooks for namespaces labelled kubefill-e2e=true (cloneStack.namespace
// makes those); and the token API behind the real APIService with
// `kubefill uploadproxy`, whose URL CDIConfig publishes. They share the
// install namespace kubefill-e2e.
var shared *cloneStack

const (
	sharedInstallNamespace = "kubefill-e2e"
	sharedWebhookLabel     = "kubefill-e2e"
)

// controllerUser is who every controller in this process runs as (through
// impersonation, with cluster-admin's rights, as the admin did): the
// kubefill-controller ServiceAccount of the shared install namespace, as an
// install's controller is. The tests' own requests are the admin's, so the
// webhooks tell them from the controller's (--controller-user): a clone
// the controller asks for is one of a DataImportCron's, and only the
// controller may change an extended clone token.
var controllerUser = admission.DefaultControllerUser(sharedInstallNamespace)

// controllerArgs are the admission servers' flags for controllerUser.
func controllerArgs(args ...string) []string {
	return append([]string{"--controller-user=" + controllerUser}, args...)
}

// controllerConfig is cl.Config as controllerUser.
func controllerConfig() *rest.Config {
	cfg := rest.CopyConfig(cl.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: controllerUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + sharedInstallNamespace, "system:authenticated"}}
	return cfg
}

// controllerRights gives controllerUser cluster-admin's rights.
func controllerRights(ctx context.Context, c client.Client) (func() error, error) {
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "kubefill-e2e-controller"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: sharedInstallNamespace, Name: "kubefill-controller"}}}
	if err := c.Create(ctx, crb); err != nil {
		return nil, fmt.Errorf("binding cluster-admin to the controller's identity: %w", err)
	}
	return func() error { return client.IgnoreNotFound(c.Delete(context.Background(), crb)) }, nil
}

// startShared starts the shared stack on c and returns its teardown.
func startShared(c *cluster.Cluster) (func() error, error) {
	cl = c
	// The controllers log their errors; the rest stays quiet.
	ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stops []func() error
	teardown := func() error {
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			errs = append(errs, stops[i]())
		}
		return errors.Join(errs...)
	}
	fail := func(err error) (func() error, error) { return teardown, err }

	if _, err := cl.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sharedInstallNamespace}}, metav1.CreateOptions{}); err != nil {
		return fail(fmt.Errorf("creating the install namespace: %w", err))
	}
	if err := cl.WaitServiceAccount(ctx, sharedInstallNamespace); err != nil {
		return fail(err)
	}
	adm, err := cl.StartAdmission(ctx, sharedInstallNamespace, sharedWebhookLabel, controllerArgs()...)
	if err != nil {
		return fail(fmt.Errorf("starting the admission webhooks: %w", err))
	}
	stops = append(stops, adm.Stop)
	s, err := newStackClient()
	if err != nil {
		return fail(err)
	}
	s.adm, s.installNS = adm, sharedInstallNamespace
	unbind, err := controllerRights(ctx, s.c)
	if err != nil {
		return fail(err)
	}
	stops = append(stops, unbind)
	if err := pollerAccount(ctx, s.c, s.installNS); err != nil {
		return fail(err)
	}
	stops = append(stops, func() error { return removePollerAccount(s.c, s.installNS) })

	port, err := cluster.FreePort()
	if err != nil {
		return fail(err)
	}
	// The controller publishes the proxy's URL in CDIConfig, where the CLIs look.
	proxyURL := "https://" + net.JoinHostPort(cl.UploadProxyHost(), strconv.Itoa(port))
	stopController, err := runManager(managerOptions(cloneTokenKeys(adm),
		func(o *controller.ManagerOptions) {
			o.UploadProxyURL = proxyURL
			o.ExcludeNamespaces = allOwnNamespaces()
		}))
	if err != nil {
		return fail(err)
	}
	stops = append(stops, func() error { stopController(); return nil })
	if err := waitProxyURL(ctx, s.c, proxyURL); err != nil {
		return fail(err)
	}
	svc, err := cl.StartUploadServices(ctx, s.installNS, port)
	if err != nil {
		return fail(fmt.Errorf("starting the token API server and the upload proxy: %w", err))
	}
	stops = append(stops, svc.Stop)
	s.svc = svc
	shared = s
	return teardown, nil
}

// newStackClient is a stack with a client that also knows the snapshot API.
func newStackClient() (*cloneStack, error) {
	scheme := controller.NewScheme()
	if err := snapshotv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cl.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return &cloneStack{c: c}, nil
}

// waitProxyURL waits until CDIConfig's status publishes url.
func waitProxyURL(ctx context.Context, c client.Client, url string) error {
	var last string
	for {
		cfg := &cdiv1.CDIConfig{}
		err := c.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, cfg)
		if err == nil && cfg.Status.UploadProxyURL != nil && *cfg.Status.UploadProxyURL == url {
			return nil
		}
		last = fmt.Sprintf("status %+v, error %v", cfg.Status, err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("CDIConfig %s does not publish the upload proxy URL %s: %s", cdiv1.CDIConfigName, url, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// pollerAccount makes the poller's ServiceAccount in the install namespace
// with what manifests/install/poller-rbac.yaml grants it.
func pollerAccount(ctx context.Context, c client.Client, installNS string) error {
	name := "kubefill-cronjob-" + installNS
	for _, o := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: installNS, Name: controller.DefaultPollerServiceAccount}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{cdiv1.GroupName}, Resources: []string{"dataimportcrons"}, Verbs: []string{"get", "patch"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: installNS, Name: controller.DefaultPollerServiceAccount}}},
	} {
		if err := c.Create(ctx, o); err != nil {
			return fmt.Errorf("creating the poller's %T: %w", o, err)
		}
	}
	return nil
}

// removePollerAccount removes what pollerAccount made outside the install
// namespace.
func removePollerAccount(c client.Client, installNS string) error {
	name := "kubefill-cronjob-" + installNS
	var errs []error
	for _, o := range []client.Object{&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}}, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}}} {
		if err := c.Delete(context.Background(), o); client.IgnoreNotFound(err) != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// managerOptions are a test controller's settings: the worker image the
// node has, no metrics or probe listeners, then configure's changes.
func managerOptions(configure ...func(*controller.ManagerOptions)) controller.ManagerOptions {
	opts := controller.ManagerOptions{
		MetricsBindAddress: "0", HealthProbeBindAddress: "0", SkipNameValidation: true,
		WorkerImage: "kubefill/kubefill:e2e", WorkerPullPolicy: corev1.PullIfNotPresent,
	}
	for _, f := range configure {
		f(&opts)
	}
	return opts
}

// runManager starts a controller manager, as controllerUser, and returns
// what stops it (once, waiting until it has).
func runManager(opts controller.ManagerOptions) (func(), error) {
	mgr, err := controller.NewManager(controllerConfig(), opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }, nil
}

// startManager runs a controller manager for one test, one that can be
// stopped mid-test; it must be limited to the test's own namespaces
// (inNamespaces), which the shared controller leaves alone.
func startManager(t *testing.T, configure ...func(*controller.ManagerOptions)) (client.Client, func()) {
	t.Helper()
	opts := managerOptions(configure...)
	if len(opts.Namespaces) == 0 {
		t.Fatal("a test's own controller must be limited to its own namespaces (inNamespaces): the shared one runs everywhere else")
	}
	stop, err := runManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	c, err := client.New(cl.Config, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c, stop
}

// inNamespaces limits a controller to namespaces.
func inNamespaces(namespaces ...string) func(*controller.ManagerOptions) {
	return func(o *controller.ManagerOptions) { o.Namespaces = namespaces }
}

// ownNamespaceCounts are the tests that run a controller of their own (they
// stop and restart it mid-flow) and how many namespaces each uses: the
// first of a test's ownNamespaces is its stack's install namespace, if it
// has one. The shared controller leaves them all alone, so these tests run
// beside the others.
var ownNamespaceCounts = map[string]int{
	"TestControllerRestartMidImport": 1,
	// The install namespace, then two for each of the five subtests.
	"TestCloneFaults": 1 + 2*5,
}

// ownNamespaces are the names of test's own namespaces.
func ownNamespaces(test string) []string {
	n := ownNamespaceCounts[test]
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("own-%s-%d", strings.ToLower(strings.TrimPrefix(test, "Test")), i)
	}
	return out
}

// allOwnNamespaces are every test's own namespaces.
func allOwnNamespaces() []string {
	var out []string
	for test := range ownNamespaceCounts {
		out = append(out, ownNamespaces(test)...)
	}
	return out
}

// createOwnNamespace creates the test's own namespace name with labels, waits
// for its default ServiceAccount, and deletes it after the test.
func createOwnNamespace(t *testing.T, name string, labels map[string]string) string {
	t.Helper()
	ctx := testContext(t, time.Minute)
	if _, err := cl.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		err := cl.Client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", name, err)
		}
	})
	if err := cl.WaitServiceAccount(ctx, name); err != nil {
		t.Fatalf("namespace %s: %v", name, err)
	}
	return name
}

// startOwnCloneStack is a stack of the test's own (its name must be in
// ownNamespaceCounts), in its own namespaces: `kubefill apiserver` with
// admissionArgs, for the namespaces the stack's namespace() makes, and a
// controller limited to them that restartController replaces. The shared
// controller keeps the cluster-scoped objects (StorageProfiles, CDIConfig).
func startOwnCloneStack(t *testing.T, admissionArgs ...string) *cloneStack {
	t.Helper()
	names := ownNamespaces(t.Name())
	if len(names) < 2 {
		t.Fatalf("%s has no own namespaces: add it to ownNamespaceCounts", t.Name())
	}
	installNS := createOwnNamespace(t, names[0], nil)
	label := "kubefill-own-" + randomSuffix()
	adm, err := cl.StartAdmission(testContext(t, 2*time.Minute), installNS, label, controllerArgs(admissionArgs...)...)
	if err != nil {
		t.Fatalf("starting the admission webhooks: %v", err)
	}
	t.Cleanup(func() {
		if err := adm.Stop(); err != nil {
			t.Errorf("stopping the admission webhooks: %v", err)
		}
	})
	s, err := newStackClient()
	if err != nil {
		t.Fatal(err)
	}
	s.adm, s.installNS, s.t = adm, installNS, t
	s.own = &ownNames{test: t.Name(), names: names[1:]}
	s.startController()
	return s
}

// ownNames hands out a stack's own namespace names, each once.
type ownNames struct {
	test  string
	mu    sync.Mutex
	names []string
	next  int
}

func (o *ownNames) take(t *testing.T) string {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.next == len(o.names) {
		t.Fatalf("%s has used its %d own namespaces: raise its ownNamespaceCounts", o.test, len(o.names)+1)
	}
	o.next++
	return o.names[o.next-1]
}

// startController runs the own stack's controller manager, limited to its
// namespaces and configured with its admission server's token keys.
func (s *cloneStack) startController() {
	s.t.Helper()
	_, s.stopController = startManager(s.t, cloneTokenKeys(s.adm), inNamespaces(ownNamespaces(s.own.test)...))
}

// restartController stops the own stack's controller manager (its
// reconciles' requests are cancelled mid-way), waits down, and starts a new
// one, as a controller pod killed and replaced would be.
func (s *cloneStack) restartController(down time.Duration) {
	if s.own == nil {
		panic("only a test's own stack restarts its controller")
	}
	s.stopController()
	time.Sleep(down)
	s.startController()
}

// cloneTokenKeys configures the controller to validate clone tokens with
// the signing key the admission server made, read from its public half in
// a directory as a Deployment mounts it (--token-key-dir), in the install
// namespace both share.
func cloneTokenKeys(adm *cluster.Admission) func(*controller.ManagerOptions) {
	return func(o *controller.ManagerOptions) {
		o.InstallNamespace = adm.InstallNamespace
		o.TokenKeyDir = adm.SigningKeyDir
	}
}
