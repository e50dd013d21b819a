package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubefill/kubefill/pkg/apiserver"
	"github.com/kubefill/kubefill/pkg/pki"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/kit"
)

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// aggEnv is a control plane of its own, configured as for an aggregated API
// server: a front-proxy (request-header) CA and its client certificate,
// Node,RBAC authorisation, and our CRDs.
type aggEnv struct {
	env        *envtest.Environment
	cfg        *rest.Config
	client     client.Client
	frontProxy *kit.CA
	// proxyCert is the front-proxy-client certificate kube-apiserver uses.
	proxyCert tls.Certificate
}

const frontProxyName = "front-proxy-client"

func startAggEnv(t *testing.T) *aggEnv {
	t.Helper()
	return startAggEnvWith(t, nil)
}

// startAggEnvWith is startAggEnv, with configure setting more
// kube-apiserver flags (in dir, the test's files) before it starts.
func startAggEnvWith(t *testing.T, configure func(e *aggEnv, args *envtest.Arguments, dir string)) *aggEnv {
	t.Helper()
	dir := t.TempDir()
	fp := kit.TestCA(t, "front-proxy-ca")
	proxyPair, proxyCertPEM, proxyKeyPEM := fp.ClientCert(t, frontProxyName)
	env := ownEnvironment(t)
	e := &aggEnv{env: env, frontProxy: fp, proxyCert: proxyPair}
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("authorization-mode", "Node,RBAC")
	args.Set("requestheader-client-ca-file", writeFile(t, dir, "front-proxy-ca.crt", fp.CertPEM))
	args.Set("requestheader-allowed-names", frontProxyName)
	args.Set("requestheader-username-headers", "X-Remote-User")
	args.Set("requestheader-group-headers", "X-Remote-Group")
	args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
	args.Set("proxy-client-cert-file", writeFile(t, dir, "front-proxy-client.crt", proxyCertPEM))
	args.Set("proxy-client-key-file", writeFile(t, dir, "front-proxy-client.key", proxyKeyPEM))
	args.Set("enable-aggregator-routing", "true")
	if configure != nil {
		configure(e, args, dir)
	}
	e.cfg, e.client = startOwnControlPlane(t, env, "aggregated-API control plane (Node,RBAC, front-proxy CA)")
	return e
}

// userConfig is a rest.Config authenticated by a client certificate for name.
func (e *aggEnv) userConfig(t *testing.T, name string, groups ...string) *rest.Config {
	t.Helper()
	u, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return u.Config()
}

func (e *aggEnv) userClient(t *testing.T, name string, groups ...string) client.Client {
	t.Helper()
	c, err := client.New(e.userConfig(t, name, groups...), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *aggEnv) namespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	if err := e.client.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// runningServer is our apiserver started in-process by apiserver.Run.
type runningServer struct {
	addr      string
	caPEM     []byte
	certFile  string
	keyFile   string
	namespace string
	secret    string
}

// serverOptions are the settings of startServerWith beyond startServer's.
type serverOptions struct {
	// listener, if set, is where the server listens (one whose address
	// kube-apiserver was told before it started).
	listener net.Listener
	// controllerUser and webhookClientNames are the flags of the same names.
	controllerUser     string
	webhookClientNames []string
}

// startServer runs `kubefill apiserver`'s Run against env with a serving
// certificate for 127.0.0.1 written to files (so reload can be tested).
func (e *aggEnv) startServer(t *testing.T, webhooks bool) *runningServer {
	t.Helper()
	return e.startServerWith(t, webhooks, serverOptions{})
}

// startServerWith is startServer with opts.
func (e *aggEnv) startServerWith(t *testing.T, webhooks bool, opts serverOptions) *runningServer {
	t.Helper()
	dir := t.TempDir()
	sc, err := pki.GenerateServingCert("kubefill-api", []string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rs := &runningServer{
		caPEM:     sc.CAPEM,
		certFile:  writeFile(t, dir, "tls.crt", sc.CertPEM),
		keyFile:   writeFile(t, dir, "tls.key", sc.KeyPEM),
		namespace: e.namespace(t, "kubefill-system-"),
		secret:    token.DefaultSigningKeySecretName,
	}
	ln := opts.listener
	if ln == nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	rs.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- apiserver.Run(ctx, e.cfg, apiserver.RunOptions{
			Options:          apiserver.Options{CertFile: rs.certFile, KeyFile: rs.keyFile, Listener: ln},
			InstallNamespace: rs.namespace,
			SigningKeySecret: rs.secret,
			UploadTokenTTL:   5 * time.Minute,
			CloneTokenTTL:    5 * time.Minute,
			TokenLeeway:      10 * time.Second,
			DisableWebhooks:  !webhooks,

			ControllerUser:     opts.controllerUser,
			WebhookClientNames: opts.webhookClientNames,
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("apiserver.Run returned: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("apiserver.Run did not stop within 10s")
		}
	})
	// Ready once the auth ConfigMap and the signing key are loaded.
	hc := rs.httpClient(t, nil)
	kit.Eventually(t, 90*time.Second, 50*time.Millisecond, "the apiserver to be ready", func() (bool, string, error) {
		select {
		case err := <-done:
			t.Fatalf("apiserver.Run exited early: %v", err)
		default:
		}
		resp, err := hc.Get("https://" + rs.addr + "/readyz")
		if err != nil {
			return false, "", err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("/readyz answered %d", resp.StatusCode), nil
	})
	return rs
}

// httpClient trusts the server's CA and presents cert if given.
func (rs *runningServer) httpClient(t *testing.T, cert *tls.Certificate) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(rs.caPEM) {
		t.Fatal("bad CA PEM")
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		c := *cert
		cfg.Certificates = []tls.Certificate{c}
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
}

// signingKeys reads the token keys our server created in its Secret.
func (rs *runningServer) signingKeys(t *testing.T, c client.Client) *token.KeySet {
	t.Helper()
	var s corev1.Secret
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: rs.namespace, Name: rs.secret}, &s); err != nil {
		t.Fatalf("reading signing key secret: %v", err)
	}
	ks, err := token.KeySetFromSecret(&s, false)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}
