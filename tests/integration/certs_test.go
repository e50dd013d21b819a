package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/apiserver"
	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/importer"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/pkg/uploadproxy"
	"github.com/kubefill/kubefill/pkg/uploadserver"
	"github.com/kubefill/kubefill/tests/kit"
)

// secretMirror copies a Secret's keys into a directory whenever it changes,
// as kubelet projects a Secret volume (each file replaced by a rename).
func secretMirror(t *testing.T, ctx context.Context, c client.Client, ns, name string) string {
	t.Helper()
	dir := t.TempDir()
	var last string
	sync := func() bool {
		s := &corev1.Secret{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, s); err != nil {
			return false
		}
		if s.ResourceVersion == last {
			return true
		}
		for k, v := range s.Data {
			tmp := filepath.Join(dir, "."+k+".tmp")
			if err := os.WriteFile(tmp, v, 0o600); err != nil {
				t.Error(err)
				return false
			}
			if err := os.Rename(tmp, filepath.Join(dir, k)); err != nil {
				t.Error(err)
				return false
			}
		}
		last = s.ResourceVersion
		return true
	}
	kit.Until(t, 60*time.Second, "Secret "+name+" to exist", sync)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
				sync()
			}
		}
	}()
	return dir
}

func poolOf(pemBytes []byte) *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(pemBytes)
	return p
}

func pemCerts(t *testing.T, b []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return out
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
}

// handshake dials addr verifying serverName against pool and returns the
// served certificate.
func handshake(addr, serverName string, pool *x509.CertPool) (*x509.Certificate, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// TestCertificateRotation runs the real controller manager with short
// certificate lifetimes from the CDI resource's spec.certConfig, and the
// real API server and upload proxy serving from Secret files that follow
// the Secrets as kubelet's projection would. Through two rotations of every
// signer it checks the chains' names and annotations, that each bundle keeps
// the previous CA while it is valid, that the APIService's and the
// webhooks' caBundle follow the API server's bundle, that TLS clients
// trusting the bundles never fail against the reloading servers, and that an
// upload through the proxy into an upload server signed by the current
// signer succeeds in every round.
func TestCertificateRotation(t *testing.T) {
	t.Parallel()
	envCfg, c := startOwnControlPlane(t, ownEnvironment(t), "certificate rotation control plane")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := "kubefill-system"
	mustCreate(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	// The Services the serving certificates name; the proxy's cluster IP is
	// a name of its certificate too.
	for _, name := range []string{certs.DefaultAPIServerService, certs.DefaultUploadProxyService} {
		mustCreate(t, c, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}}})
	}
	proxySvc := &corev1.Service{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: certs.DefaultUploadProxyService}, proxySvc); err != nil {
		t.Fatal(err)
	}
	// The registrations the bundle goes into: an APIService and webhooks
	// pointing at the API server's Service, and one webhook pointing
	// elsewhere that must be left alone. They match nothing (the namespace
	// selector), so that they never get called.
	apiSvc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": "v1.certs-test.kubefill.io"},
		"spec": map[string]any{"group": "certs-test.kubefill.io", "version": "v1", "groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"service": map[string]any{"namespace": ns, "name": certs.DefaultAPIServerService, "port": int64(443)}},
	}}
	mustCreate(t, c, apiSvc)
	nothing := &metav1.LabelSelector{MatchLabels: map[string]string{"certs-test": "no-such-namespace"}}
	hook := func(name, service string) admissionregistrationv1.ValidatingWebhook {
		return admissionregistrationv1.ValidatingWebhook{Name: name, AdmissionReviewVersions: []string{"v1"},
			SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone), FailurePolicy: ptr.To(admissionregistrationv1.Ignore), NamespaceSelector: nothing,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: service, Path: ptr.To("/x")}},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}}}
	}
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "certs-test-validate"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{hook("ours.certs-test.kubefill.io", certs.DefaultAPIServerService), hook("theirs.certs-test.kubefill.io", "someone-else")}}
	mustCreate(t, c, validating)
	m := hook("mutate.certs-test.kubefill.io", certs.DefaultAPIServerService)
	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "certs-test-mutate"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: m.Name, AdmissionReviewVersions: m.AdmissionReviewVersions, SideEffects: m.SideEffects,
			FailurePolicy: m.FailurePolicy, NamespaceSelector: nothing, ClientConfig: m.ClientConfig, Rules: m.Rules}}}
	mustCreate(t, c, mutating)

	// The CDI resource with lifetimes of seconds: CAs 30s renewed after 15s,
	// leaves 20s renewed after 10s.
	dur := func(s string) *metav1.Duration {
		d, _ := time.ParseDuration(s)
		return &metav1.Duration{Duration: d}
	}
	mustCreate(t, c, &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}, Spec: cdiv1.CDISpec{CertConfig: &cdiv1.CDICertConfig{
		CA:     &cdiv1.CertConfig{Duration: dur("30s"), RenewBefore: dur("15s")},
		Server: &cdiv1.CertConfig{Duration: dur("20s"), RenewBefore: dur("10s")},
		Client: &cdiv1.CertConfig{Duration: dur("20s"), RenewBefore: dur("10s")},
	}}})
	caCfg := `{"lifetime":"30s","refresh":"15s"}`
	leafCfg := `{"lifetime":"20s","refresh":"10s"}`

	mgr, err := controller.NewManager(envCfg, controller.ManagerOptions{
		MetricsBindAddress: "0", HealthProbeBindAddress: "0", SkipNameValidation: true,
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: ns, APIServerCertificates: true, CertPoll: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-mgrDone:
		case <-time.After(20 * time.Second):
			t.Error("manager did not stop")
		}
	})

	// The chains, with CDI's names and library-go's annotations.
	secret := func(name string) *corev1.Secret {
		s := &corev1.Secret{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, s); err != nil {
			t.Fatalf("Secret %s: %v", name, err)
		}
		return s
	}
	bundleOf := func(signer string) []byte {
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: certs.BundleName(signer)}, cm); err != nil {
			t.Fatalf("ConfigMap %s: %v", certs.BundleName(signer), err)
		}
		return []byte(cm.Data[certs.BundleKey])
	}
	kit.Until(t, 60*time.Second, "the chains to be made", func() bool {
		for _, n := range []string{certs.APIServerServerCert, certs.UploadProxyServerCert, certs.UploadServerClientCert, certs.UploadServerSigner} {
			if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: n}, &corev1.Secret{}); err != nil {
				return false
			}
		}
		return true
	})
	signers := []string{certs.APIServerSigner, certs.UploadProxySigner, certs.UploadServerSigner, certs.UploadServerClientSigner, certs.CloneClientSigner}
	leaves := map[string]struct {
		signer string
		cn     string
		hosts  []string
	}{
		certs.APIServerServerCert:    {certs.APIServerSigner, "kubefill-api." + ns + ".svc", []string{"kubefill-api", "kubefill-api." + ns, "kubefill-api." + ns + ".svc"}},
		certs.UploadProxyServerCert:  {certs.UploadProxySigner, "kubefill-uploadproxy." + ns + ".svc", []string{"kubefill-uploadproxy", "kubefill-uploadproxy." + ns, "kubefill-uploadproxy." + ns + ".svc", proxySvc.Spec.ClusterIP}},
		certs.UploadServerClientCert: {certs.UploadServerClientSigner, certs.UploadServerClientName, nil},
	}
	checkChains := func() map[string]*x509.Certificate {
		t.Helper()
		cur := map[string]*x509.Certificate{}
		for _, name := range signers {
			s := secret(name)
			crt := pemCerts(t, s.Data[corev1.TLSCertKey])[0]
			cur[name] = crt
			if s.Type != corev1.SecretTypeTLS || !crt.IsCA || !strings.HasPrefix(crt.Subject.CommonName, ns+"_"+name+"@") {
				t.Errorf("signer %s: type %s, CA %v, common name %s", name, s.Type, crt.IsCA, crt.Subject.CommonName)
			}
			want := map[string]string{cdiv1.AnnCertConfig: caCfg, cdiv1.AnnCertNotAfter: crt.NotAfter.UTC().Format(time.RFC3339),
				cdiv1.AnnCertNotBefore: crt.NotBefore.UTC().Format(time.RFC3339), cdiv1.AnnCertIssuer: crt.Subject.CommonName}
			for k, v := range want {
				if s.Annotations[k] != v {
					t.Errorf("signer %s: annotation %s = %q, want %q", name, k, s.Annotations[k], v)
				}
			}
		}
		for name, l := range leaves {
			s := secret(name)
			crt := pemCerts(t, s.Data[corev1.TLSCertKey])[0]
			if _, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			if crt.Subject.CommonName != l.cn || s.Annotations[cdiv1.AnnCertConfig] != leafCfg || s.Annotations[cdiv1.AnnCertIssuer] != crt.Issuer.CommonName {
				t.Errorf("%s: common name %s, annotations %v", name, crt.Subject.CommonName, s.Annotations)
			}
			if l.hosts != nil {
				got := strings.Split(s.Annotations[cdiv1.AnnCertHostnames], ",")
				want := slices.Clone(l.hosts)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Errorf("%s: hostnames %v, want %v", name, got, want)
				}
				if err := crt.VerifyHostname(l.hosts[2]); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			} else if !slices.Contains(crt.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
				t.Errorf("%s: not a client certificate: %v", name, crt.ExtKeyUsage)
			}
			if !bytes.Contains(bundleOf(l.signer), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: crt.Raw})) {
				if _, err := crt.Verify(x509.VerifyOptions{Roots: poolOf(bundleOf(l.signer)), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
					t.Errorf("%s does not verify against %s: %v", name, certs.BundleName(l.signer), err)
				}
			}
		}
		if got, want := secret(certs.UploadServerClientCert).Data[certs.ClientCertCAKey], bundleOf(certs.UploadServerSigner); !bytes.Equal(got, want) {
			t.Errorf("%s %s is not the upload-server signer's bundle", certs.UploadServerClientCert, certs.ClientCertCAKey)
		}
		return cur
	}
	first := checkChains()

	// The API server, serving from its mirrored Secret.
	apiDir := secretMirror(t, ctx, c, ns, certs.APIServerServerCert)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	apiAddr := ln.Addr().String()
	apiDone := make(chan error, 1)
	go func() {
		apiDone <- apiserver.Run(ctx, envCfg, apiserver.RunOptions{
			Options:          apiserver.Options{CertFile: filepath.Join(apiDir, "tls.crt"), KeyFile: filepath.Join(apiDir, "tls.key"), Listener: ln},
			InstallNamespace: ns, SigningKeySecret: token.DefaultSigningKeySecretName,
			UploadTokenTTL: 5 * time.Minute, CloneTokenTTL: 5 * time.Minute, TokenLeeway: 10 * time.Second, DisableWebhooks: true,
		})
	}()

	// The upload proxy, serving from its Secret and reaching upload servers
	// with the client certificate Secret; upload servers take a fixed port.
	proxyDir := secretMirror(t, ctx, c, ns, certs.UploadProxyServerCert)
	clientDir := secretMirror(t, ctx, c, ns, certs.UploadServerClientCert)
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := token.EncodePublicKeyPEM(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDir := t.TempDir()
	writeFile(t, keyDir, token.SecretPublicKey, pub)
	gen := token.NewGenerator(token.UploadTokenIssuer, key, time.Minute)
	upPort := freeLoopbackPort(t)
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxyAddr := pln.Addr().String()
	proxyDone := make(chan error, 1)
	go func() {
		proxyDone <- uploadproxy.Run(ctx, envCfg, uploadproxy.RunOptions{
			Listener: pln, CertFile: filepath.Join(proxyDir, "tls.crt"), KeyFile: filepath.Join(proxyDir, "tls.key"),
			SigningKeyDir: keyDir, TokenLeeway: 5 * time.Second,
			Upstream: uploadproxy.UpstreamTLS{ClientCertFile: filepath.Join(clientDir, "tls.crt"), ClientKeyFile: filepath.Join(clientDir, "tls.key"),
				CAFile: filepath.Join(clientDir, certs.ClientCertCAKey)},
			Address: uploadproxy.AddressPodIP, UpstreamPort: upPort, PodWait: 10 * time.Second,
		})
	}()

	// Clients as kube-apiserver's aggregator is one: trusting the
	// APIService's caBundle as it is now; the proxy's clients trust its
	// signer's bundle ConfigMap.
	apiPool := func() (*x509.CertPool, error) {
		a := &unstructured.Unstructured{}
		a.SetAPIVersion("apiregistration.k8s.io/v1")
		a.SetKind("APIService")
		if err := c.Get(ctx, types.NamespacedName{Name: apiSvc.GetName()}, a); err != nil {
			return nil, err
		}
		b64, _, _ := unstructured.NestedString(a.Object, "spec", "caBundle")
		b, err := base64.StdEncoding.DecodeString(b64)
		if err != nil || len(b) == 0 {
			return nil, fmt.Errorf("APIService caBundle %q: %v", b64, err)
		}
		return poolOf(b), nil
	}
	apiName := "kubefill-api." + ns + ".svc"
	proxyName := "kubefill-uploadproxy." + ns + ".svc"
	getOK := func(addr, name string, pool *x509.CertPool, path string) error {
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS12}}}
		resp, err := hc.Get("https://" + addr + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return nil
	}
	kit.Until(t, 90*time.Second, "the API server and the upload proxy to answer over TLS", func() bool {
		select {
		case err := <-apiDone:
			t.Fatalf("apiserver.Run: %v", err)
		case err := <-proxyDone:
			t.Fatalf("uploadproxy.Run: %v", err)
		default:
		}
		pool, err := apiPool()
		return err == nil && getOK(apiAddr, apiName, pool, "/readyz") == nil && getOK(proxyAddr, proxyName, poolOf(bundleOf(certs.UploadProxySigner)), "/healthz") == nil
	})

	// From now on clients keep calling both servers; none may fail.
	var calls, failures atomic.Int64
	var failMu sync.Mutex
	var failMsgs []string
	probeCtx, stopProbes := context.WithCancel(ctx)
	probesDone := make(chan struct{})
	go func() {
		defer close(probesDone)
		for probeCtx.Err() == nil {
			pool, err := apiPool()
			if err == nil {
				err = getOK(apiAddr, apiName, pool, "/healthz")
			}
			if err == nil {
				err = getOK(proxyAddr, proxyName, poolOf(bundleOf(certs.UploadProxySigner)), "/healthz")
			}
			calls.Add(1)
			if err != nil && probeCtx.Err() == nil {
				failures.Add(1)
				failMu.Lock()
				failMsgs = append(failMsgs, time.Now().Format("15:04:05.000")+" "+err.Error())
				failMu.Unlock()
			}
			time.Sleep(150 * time.Millisecond)
		}
	}()

	// An upload in each round, into a new upload server whose certificate
	// the current upload-server signer issued, as the populator does.
	upload := func(round int) {
		t.Helper()
		prime := fmt.Sprintf("prime-%d-%s", round, strconv.FormatInt(time.Now().UnixNano(), 36))
		u, err := populators.LoadUploadPKI(ctx, c, c, ns)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		crt, k, err := u.ServerSigner.CA.Issue("upload", []string{uploadproxy.ServiceHost("user", prime)}, false, certs.LeafValidity(u.ServerSigner, time.Hour, time.Now()))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, dir, "tls.crt", crt)
		writeFile(t, dir, "tls.key", k)
		writeFile(t, dir, "client-ca.crt", u.ClientBundle)
		volume := filepath.Join(dir, "volume")
		for _, d := range []string{volume, filepath.Join(dir, "scratch")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		us, err := uploadserver.New(uploadserver.Config{
			Addr: "127.0.0.1:" + strconv.Itoa(upPort), CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"),
			ClientCAFile: filepath.Join(dir, "client-ca.crt"), ClientName: populators.UploadProxyClientName,
			Paths: importer.Paths{DataPath: filepath.Join(volume, "disk.img"), BlockPath: filepath.Join(dir, "no-block-device"),
				ScratchDir: filepath.Join(dir, "scratch"), TerminationLog: filepath.Join(dir, "termination-log")},
			ImageSize: 4 << 20, OwnerUID: "uid-" + strconv.Itoa(round),
		}, testr.New(t))
		if err != nil {
			t.Fatal(err)
		}
		usDone := make(chan error, 1)
		go func() { usDone <- us.Run(ctx) }()
		group := cdiv1.GroupName
		target := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "user", Name: fmt.Sprintf("disk-%d", round), Annotations: map[string]string{cdiv1.AnnUploadRequest: "", cdiv1.AnnUsePopulator: "true"}},
			Spec:       *kit.ClaimSpec("4Mi"),
		}
		target.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: cdiv1.VolumeUploadSourceRef, Name: target.Name}
		mustCreate(t, c, target)
		playUploadPopulator(t, ctx, c, target, prime, 0)
		image := make([]byte, 1<<20)
		_, _ = rand.Read(image)
		tok, err := gen.Generate(token.NewUploadPayload("user", target.Name))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, "https://"+proxyAddr+uploadproxy.PathUpload, bytes.NewReader(image))
		req.Header.Set("Authorization", "Bearer "+tok)
		hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: poolOf(bundleOf(certs.UploadProxySigner)), ServerName: proxyName}}}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("round %d upload: %v", round, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("round %d upload through the proxy: %d %s", round, resp.StatusCode, body)
		}
		got, err := os.ReadFile(filepath.Join(volume, "disk.img"))
		if err != nil || !bytes.Equal(got[:len(image)], image) {
			t.Fatalf("round %d: the volume does not hold the upload (%v)", round, err)
		}
		select {
		case <-usDone:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: the upload server did not exit after the upload", round)
		}
		t.Logf("round %d: uploaded %d bytes through the proxy into an upload server signed by %s", round, len(image), u.ServerSigner.Cert.Subject.CommonName)
	}
	mustCreate(t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "user"}})
	upload(0)

	caBundles := func() (apiService []byte, hooks [][]byte) {
		a := &unstructured.Unstructured{}
		a.SetAPIVersion("apiregistration.k8s.io/v1")
		a.SetKind("APIService")
		if err := c.Get(ctx, types.NamespacedName{Name: apiSvc.GetName()}, a); err != nil {
			t.Fatal(err)
		}
		b64, _, _ := unstructured.NestedString(a.Object, "spec", "caBundle")
		apiService, _ = base64.StdEncoding.DecodeString(b64)
		v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := c.Get(ctx, types.NamespacedName{Name: validating.Name}, v); err != nil {
			t.Fatal(err)
		}
		mw := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := c.Get(ctx, types.NamespacedName{Name: mutating.Name}, mw); err != nil {
			t.Fatal(err)
		}
		if len(v.Webhooks[1].ClientConfig.CABundle) != 0 {
			t.Errorf("the webhook pointing at another Service got a caBundle")
		}
		return apiService, [][]byte{v.Webhooks[0].ClientConfig.CABundle, mw.Webhooks[0].ClientConfig.CABundle}
	}

	prev := first
	for round := 1; round <= 2; round++ {
		start := time.Now()
		kit.Until(t, 45*time.Second, fmt.Sprintf("rotation %d of every signer", round), func() bool {
			for _, name := range signers {
				s := &corev1.Secret{}
				if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, s); err != nil {
					return false
				}
				if bytes.Equal(pemCerts(t, s.Data[corev1.TLSCertKey])[0].Raw, prev[name].Raw) {
					return false
				}
			}
			return true
		})
		// Let the pass that rotated finish (leaves, injection) before reading.
		time.Sleep(time.Second)
		cur := checkChains()
		t.Logf("rotation %d: all five signers replaced within %s, e.g. %s -> %s", round, time.Since(start).Round(100*time.Millisecond),
			prev[certs.APIServerSigner].Subject.CommonName, cur[certs.APIServerSigner].Subject.CommonName)
		for _, name := range signers {
			bundle := pemCerts(t, bundleOf(name))
			if !bundle[0].Equal(cur[name]) {
				t.Errorf("%s: the bundle does not start with the current CA", certs.BundleName(name))
			}
			now := time.Now()
			for _, b := range bundle {
				if !now.Before(b.NotAfter.Add(time.Second)) {
					t.Errorf("%s keeps a CA that expired at %s", certs.BundleName(name), b.NotAfter)
				}
			}
			if time.Now().Before(prev[name].NotAfter.Add(-2*time.Second)) && !slices.ContainsFunc(bundle, prev[name].Equal) {
				t.Errorf("%s dropped the previous CA, valid until %s", certs.BundleName(name), prev[name].NotAfter)
			}
			t.Logf("%s holds %d CAs", certs.BundleName(name), len(bundle))
		}
		kit.Until(t, 20*time.Second, "the caBundles to be the API server's bundle", func() bool {
			want := bundleOf(certs.APIServerSigner)
			a, hooks := caBundles()
			return bytes.Equal(a, want) && bytes.Equal(hooks[0], want) && bytes.Equal(hooks[1], want)
		})
		// The servers reload: they serve leaves of the current signers.
		kit.Until(t, 20*time.Second, "the API server and the proxy to serve certificates of the new signers", func() bool {
			pool, err := apiPool()
			if err != nil {
				return false
			}
			a, err1 := handshake(apiAddr, apiName, pool)
			p, err2 := handshake(proxyAddr, proxyName, poolOf(bundleOf(certs.UploadProxySigner)))
			return err1 == nil && err2 == nil && a.CheckSignatureFrom(cur[certs.APIServerSigner]) == nil && p.CheckSignatureFrom(cur[certs.UploadProxySigner]) == nil
		})
		upload(round)
		prev = cur
	}
	stopProbes()
	<-probesDone
	t.Logf("%d calls to the API server and the proxy through two rotations, %d failed", calls.Load(), failures.Load())
	if calls.Load() < 20 {
		t.Errorf("only %d calls were made", calls.Load())
	}
	if failures.Load() > 0 {
		t.Errorf("%d calls failed across the rotations: %s", failures.Load(), strings.Join(failMsgs, "; "))
	}
	ev, _ := json.Marshal(secret(certs.APIServerServerCert).Annotations)
	t.Logf("%s annotations: %s", certs.APIServerServerCert, ev)
}

// freeLoopbackPort is a TCP port on 127.0.0.1 free right now.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
