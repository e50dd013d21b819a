package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"

	"github.com/kubefill/kubefill/pkg/apiserver"
	"github.com/kubefill/kubefill/pkg/pki"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// testNetns is a network namespace joined to the host by a veth pair with one
// /32 address on each end. Nothing is routed beyond the pair.
type testNetns struct {
	name     string
	hostIf   string
	hostAddr string
	nsAddr   string
}

func runIP(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// netnsSeq numbers the network namespaces this process makes.
var netnsSeq atomic.Int32

func newTestNetns(t *testing.T) *testNetns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the aggregator test needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("the aggregator test needs the ip command (Debian package iproute2)")
	}
	// Tests of one process run side by side: the names carry a number of
	// the call's own beside the process id.
	seq := int(netnsSeq.Add(1))
	n := &testNetns{
		name:   fmt.Sprintf("kfagg%d-%d", os.Getpid(), seq),
		hostIf: fmt.Sprintf("kfah%d-%d", os.Getpid()%100000, seq),
	}
	nsIf := fmt.Sprintf("kfan%d-%d", os.Getpid()%100000, seq)
	runIP(t, "netns", "add", n.name)
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", n.hostIf).Run()
		if out, err := exec.Command("ip", "netns", "del", n.name).CombinedOutput(); err != nil {
			t.Logf("deleting netns %s: %v: %s", n.name, err, out)
		}
	})
	runIP(t, "link", "add", n.hostIf, "type", "veth", "peer", "name", nsIf)
	runIP(t, "link", "set", nsIf, "netns", n.name)
	runIP(t, "link", "set", n.hostIf, "up")
	// Pick a /32 pair whose route is free; another test process may hold one.
	for try := 0; ; try++ {
		id := (os.Getpid() + 17*seq + try) % 250
		n.hostAddr, n.nsAddr = fmt.Sprintf("10.252.%d.1", id), fmt.Sprintf("10.252.%d.2", id)
		if out, err := exec.Command("ip", "route", "add", n.nsAddr+"/32", "dev", n.hostIf).CombinedOutput(); err != nil {
			if try < 10 && strings.Contains(string(out), "File exists") {
				continue
			}
			t.Fatalf("ip route add %s/32: %v: %s", n.nsAddr, err, out)
		}
		break
	}
	runIP(t, "addr", "add", n.hostAddr+"/32", "dev", n.hostIf)
	runIP(t, "-n", n.name, "link", "set", "lo", "up")
	runIP(t, "-n", n.name, "addr", "add", n.nsAddr+"/32", "dev", nsIf)
	runIP(t, "-n", n.name, "link", "set", nsIf, "up")
	runIP(t, "-n", n.name, "route", "add", n.hostAddr+"/32", "dev", nsIf)
	return n
}

// listen opens a TCP listener inside the namespace. The socket keeps the
// namespace it was created in, so the rest of the process (which talks to
// kube-apiserver on the host's loopback) stays in the host namespace.
func (n *testNetns) listen(t *testing.T, port int) net.Listener {
	t.Helper()
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// This thread's namespace changes; if it cannot be restored the thread
		// must not be reused, so it stays locked and exits with the goroutine.
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer orig.Close()
		target, err := os.Open("/var/run/netns/" + n.name)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("entering netns: %w", err)}
			return
		}
		ln, lerr := net.Listen("tcp", net.JoinHostPort(n.nsAddr, fmt.Sprint(port)))
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("leaving netns: %w", err)}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{ln: ln, err: lerr}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listening in netns %s: %v", n.name, r.err)
	}
	return r.ln
}

// serveTokenAPI runs `kubefill apiserver` in a network namespace behind a
// real APIService, so that requests go through kube-apiserver's
// aggregator, and fails the test unless the APIService is Available within
// availableWithin; it returns the install namespace holding the signing key.
func serveTokenAPI(t *testing.T, e *aggEnv, availableWithin time.Duration) string {
	t.Helper()
	n := newTestNetns(t)
	const port = 8443
	installNS := e.namespace(t, "kubefill-")
	svcName := "kubefill-api"

	// Serving certificate for the Service name the aggregator verifies.
	dir := t.TempDir()
	sc, err := pki.GenerateServingCert("kubefill-api", []string{svcName + "." + installNS + ".svc", n.nsAddr}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ln := n.listen(t, port)
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- apiserver.Run(runCtx, e.cfg, apiserver.RunOptions{
			Options: apiserver.Options{
				CertFile: writeFile(t, dir, "tls.crt", sc.CertPEM), KeyFile: writeFile(t, dir, "tls.key", sc.KeyPEM), Listener: ln,
			},
			InstallNamespace: installNS, SigningKeySecret: token.DefaultSigningKeySecretName,
			UploadTokenTTL: 5 * time.Minute, CloneTokenTTL: 5 * time.Minute, TokenLeeway: 10 * time.Second, DisableWebhooks: true,
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("apiserver.Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("apiserver.Run did not stop")
		}
	})

	// Service without selector + EndpointSlice at the namespace's address.
	svc, slice, apisvc := cluster.TokenAPIObjects(installNS, n.nsAddr, port, sc.CAPEM)
	for _, o := range []client.Object{svc, slice, apisvc} {
		mustCreate(t, e.client, o)
	}
	t.Cleanup(func() { _ = e.client.Delete(context.Background(), apisvc) })
	took := kit.Eventually(t, availableWithin, kit.Interval, "APIService v1beta1.upload.cdi.kubevirt.io to be Available", func() (bool, string, error) {
		if err := e.client.Get(context.Background(), client.ObjectKeyFromObject(apisvc), apisvc); err != nil {
			return false, "", err
		}
		available, message := cluster.APIServiceAvailable(apisvc)
		return available, message, nil
	})
	t.Logf("APIService v1beta1.upload.cdi.kubevirt.io Available %s after apply", took.Round(time.Millisecond))
	return installNS
}

// The stretch goal: kube-apiserver's aggregator routes UploadTokenRequests to
// our server through a real APIService, and a typed client creates one.
func testThroughAggregator(t *testing.T, e *aggEnv) {
	ctx := context.Background()
	installNS := serveTokenAPI(t, e, 60*time.Second)

	// Discovery through kube-apiserver lists our resource.
	dc, err := discovery.NewDiscoveryClientForConfig(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var resources *metav1.APIResourceList
	kit.Eventually(t, 30*time.Second, kit.Interval, "discovery through the aggregator to list "+uploadv1.SchemeGroupVersion.String(), func() (bool, string, error) {
		resources, err = dc.ServerResourcesForGroupVersion(uploadv1.SchemeGroupVersion.String())
		return err == nil, "", err
	})
	if err != nil || len(resources.APIResources) != 1 || resources.APIResources[0].Name != "uploadtokenrequests" {
		t.Fatalf("discovery through the aggregator: %v %+v", err, resources)
	}

	// kube-apiserver aggregates our OpenAPI v3 document (it refuses ones it cannot parse).
	v3path := "/openapi/v3/apis/upload.cdi.kubevirt.io/v1beta1"
	kit.Eventually(t, 60*time.Second, 200*time.Millisecond, "kube-apiserver's /openapi/v3 to list our group version", func() (bool, string, error) {
		raw, err := dc.RESTClient().Get().AbsPath("/openapi/v3").DoRaw(ctx)
		return err == nil && strings.Contains(string(raw), `"apis/upload.cdi.kubevirt.io/v1beta1"`), "", err
	})
	raw, err := dc.RESTClient().Get().AbsPath(v3path).DoRaw(ctx)
	if err != nil || !strings.Contains(string(raw), "io.kubevirt.cdi.upload.v1beta1.UploadTokenRequest") {
		t.Fatalf("aggregated OpenAPI v3 document: %v %.200s", err, raw)
	}

	ns := e.namespace(t, "agg-upload-")
	if err := e.client.Create(ctx, newClaim(ns, "disk", map[string]string{cdiv1.AnnUploadRequest: ""})); err != nil {
		t.Fatal(err)
	}
	grantRole(t, e, ns, "alice", rbacv1.PolicyRule{APIGroups: []string{uploadv1.GroupName}, Resources: []string{"uploadtokenrequests"}, Verbs: []string{"create"}})
	alice, bob := e.userClient(t, "alice"), e.userClient(t, "bob")
	newReq := func() *uploadv1.UploadTokenRequest {
		return &uploadv1.UploadTokenRequest{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "token-for-virtctl-"},
			Spec:       uploadv1.UploadTokenRequestSpec{PvcName: "disk"},
		}
	}

	utr := newReq()
	begin := time.Now()
	if err := alice.Create(ctx, utr); err != nil {
		t.Fatalf("alice's UploadTokenRequest through the aggregator: %v", err)
	}
	t.Logf("UploadTokenRequest through kube-apiserver's aggregator took %s", time.Since(begin).Round(time.Microsecond))
	ks := e.serverKeys(t, installNS)
	p, err := token.NewValidator(token.UploadTokenIssuer, ks.Current, 0).Validate(utr.Status.Token)
	if err != nil {
		t.Fatalf("token from the aggregated path: %v", err)
	}
	if err := token.CheckUpload(p, ns, "disk"); err != nil {
		t.Fatal(err)
	}

	// kube-apiserver enforces RBAC before proxying: bob never reaches us.
	err = bob.Create(ctx, newReq())
	if !apierrors.IsForbidden(err) {
		t.Fatalf("bob through the aggregator: %v", err)
	}
	t.Logf("bob denied by kube-apiserver: %s", statusMessage(err))
}

func (e *aggEnv) serverKeys(t *testing.T, ns string) *token.KeySet {
	t.Helper()
	rs := &runningServer{namespace: ns, secret: token.DefaultSigningKeySecretName}
	return rs.signingKeys(t, e.client)
}

func ptrTo[T any](v T) *T { return &v }
