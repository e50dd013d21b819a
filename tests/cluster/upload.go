package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"
	"github.com/kubefill/kubefill/pkg/pki"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/pkg/token"
)

// The APIService through which kube-apiserver's aggregator reaches
// `kubefill apiserver` for UploadTokenRequests.
const (
	tokenAPIServiceName = "kubefill-api"
	uploadAPIService    = "v1beta1." + uploadv1.GroupName
)

var apiServiceGVR = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

// UploadServices are `kubefill apiserver` (behind the real APIService, so
// UploadTokenRequests go through kube-apiserver's aggregator) and `kubefill
// uploadproxy`, run from this checkout as the cluster's processes: what a
// user's `kubefill upload` or `virtctl image-upload` talks to.
type UploadServices struct {
	// ProxyURL is the user-facing upload proxy URL: on the host's loopback,
	// or on a real node at the node address.
	ProxyURL string
	// ServiceURL is the proxy's URL through its Service's ClusterIP
	// (cdi-uploadproxy in the install namespace, as CDI names it), or ""
	// without a real node (no kube-proxy).
	ServiceURL string
	// ProxyCAFile holds the CA of the proxy's serving certificate (--ca-cert).
	ProxyCAFile string

	apiserver, proxy procRecord
	dyn              dynamic.Interface
}

// ProxyPID is the upload proxy's process ID (to read its memory use).
func (u *UploadServices) ProxyPID() int { return u.proxy.PID }

// Stop ends both processes and removes the APIService.
func (u *UploadServices) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := u.dyn.Resource(apiServiceGVR).Delete(ctx, uploadAPIService, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		err = nil
	}
	return errors.Join(err, u.proxy.stop(10*time.Second), u.apiserver.stop(10*time.Second))
}

func uploadServicesDir(clusterDir, installNS string) string {
	return filepath.Join(clusterDir, "kubefill", installNS)
}

// UploadProxyCAFile is where StartUploadServices writes the CA of the upload
// proxy's serving certificate, for `kubefill upload --ca-cert`.
func UploadProxyCAFile(clusterDir, installNS string) string {
	return filepath.Join(uploadServicesDir(clusterDir, installNS), "proxy-ca.crt")
}

// FreePort returns a TCP port nobody listens on at the moment.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// GatewayAddress is the host's address that pods reach: the node address.
// kube-apiserver reaches host processes listening there too.
func (c *Cluster) GatewayAddress() (string, error) {
	if ip := c.NodeIP(); ip != "" {
		return ip, nil
	}
	return "", errors.New("the cluster runs no node (Options.Node)")
}

// StartUploadServices runs the token API server and the upload proxy for a
// Kubefill controller whose install namespace is installNS; that controller
// must be running, since the proxy's client certificate is one of its
// Secrets. proxyPort 0 picks a free port.
func (c *Cluster) StartUploadServices(ctx context.Context, installNS string, proxyPort int) (*UploadServices, error) {
	t0 := time.Now()
	if c.kubefillBin == "" {
		return nil, errors.New("the kubefill binary did not build (the cluster needs a node)")
	}
	gw, err := c.GatewayAddress()
	if err != nil {
		return nil, err
	}
	dir := uploadServicesDir(c.Dir, installNS)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	u := &UploadServices{dyn: dyn}
	if u.apiserver, err = c.startTokenAPI(ctx, dyn, installNS, gw, dir); err != nil {
		return nil, err
	}
	fail := func(err error) (*UploadServices, error) {
		return nil, errors.Join(err, u.Stop())
	}
	// What a Deployment would mount: the signing key's public half and the
	// proxy's client certificate.
	keyDir := filepath.Join(dir, "signing-key")
	if err := c.writeSecretFiles(ctx, installNS, token.DefaultSigningKeySecretName, keyDir, func(k string) bool { return strings.HasSuffix(k, ".pub") || k == "rotated-at" }); err != nil {
		return fail(err)
	}
	clientDir := filepath.Join(dir, "proxy-client")
	if err := c.writeSecretFiles(ctx, installNS, populators.UploadProxyClientSecret, clientDir, func(string) bool { return true }); err != nil {
		return fail(fmt.Errorf("%w (is a Kubefill controller with install namespace %s running?)", err, installNS))
	}
	if proxyPort == 0 {
		if proxyPort, err = FreePort(); err != nil {
			return fail(err)
		}
	}
	bind := c.UploadProxyHost()
	hosts := []string{"localhost", "127.0.0.1", bind}
	if c.NodeIP() != "" {
		ip, err := c.uploadProxyService(ctx, installNS, bind, proxyPort)
		if err != nil {
			return fail(err)
		}
		hosts = append(hosts, ip, UploadProxyServiceName+"."+installNS+".svc")
		u.ServiceURL = "https://" + ip
	}
	sc, err := pki.GenerateServingCert("kubefill-uploadproxy", hosts, 24*time.Hour)
	if err != nil {
		return fail(err)
	}
	certFile, keyFile, caFile := filepath.Join(dir, "proxy.crt"), filepath.Join(dir, "proxy.key"), UploadProxyCAFile(c.Dir, installNS)
	if err := writeFiles(map[string][]byte{certFile: sc.CertPEM, keyFile: sc.KeyPEM, caFile: sc.CAPEM}); err != nil {
		return fail(err)
	}
	u.ProxyURL, u.ProxyCAFile = "https://"+net.JoinHostPort(bind, strconv.Itoa(proxyPort)), caFile
	u.proxy, err = c.run("kubefill-uploadproxy", nil, c.kubefillBin, "uploadproxy",
		"--kubeconfig="+c.Kubeconfig,
		"--bind-address="+bind,
		"--secure-port="+strconv.Itoa(proxyPort),
		"--tls-cert-file="+certFile,
		"--tls-private-key-file="+keyFile,
		"--signing-key-dir="+keyDir,
		"--client-cert-file="+filepath.Join(clientDir, corev1.TLSCertKey),
		"--client-key-file="+filepath.Join(clientDir, corev1.TLSPrivateKeyKey),
		"--upload-server-ca-file="+filepath.Join(clientDir, "ca.crt"),
		"--upload-server-address=pod-ip",
	)
	if err != nil {
		return fail(err)
	}
	if err := waitHealthy(ctx, u.ProxyURL+"/healthz", sc.CAPEM, u.proxy); err != nil {
		return fail(fmt.Errorf("upload proxy: %w", err))
	}
	c.opts.Logf("cluster: token API behind APIService %s and upload proxy at %s (%s)", uploadAPIService, u.ProxyURL, time.Since(t0).Round(time.Millisecond))
	return u, nil
}

// UploadProxyServiceName is CDI's name for the upload proxy's Service.
const UploadProxyServiceName = "cdi-uploadproxy"

// UploadProxyHost is the address the upload proxy listens on: the node
// address on a real node (so that its Service's ClusterIP reaches it), else
// loopback.
func (c *Cluster) UploadProxyHost() string {
	if ip := c.NodeIP(); ip != "" {
		return ip
	}
	return "127.0.0.1"
}

// uploadProxyService makes the cdi-uploadproxy Service, without a selector,
// and an EndpointSlice pointing it at the proxy on the host; it returns the
// Service's ClusterIP.
func (c *Cluster) uploadProxyService(ctx context.Context, installNS, addr string, port int) (string, error) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: installNS, Name: UploadProxyServiceName},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt(port), Protocol: corev1.ProtocolTCP}}},
	}
	got, err := c.Client.CoreV1().Services(installNS).Create(ctx, svc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = c.Client.CoreV1().Services(installNS).Get(ctx, svc.Name, metav1.GetOptions{})
	}
	if err != nil {
		return "", fmt.Errorf("creating Service %s/%s: %w", installNS, svc.Name, err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: installNS, Name: UploadProxyServiceName + "-host", Labels: map[string]string{discoveryv1.LabelServiceName: UploadProxyServiceName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if _, err := c.Client.DiscoveryV1().EndpointSlices(installNS).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating EndpointSlice %s/%s: %w", installNS, slice.Name, err)
	}
	return got.Spec.ClusterIP, nil
}

// startTokenAPI runs `kubefill apiserver` on the gateway address, points a
// Service, an EndpointSlice and the APIService at it, and waits until the
// aggregator calls it Available.
func (c *Cluster) startTokenAPI(ctx context.Context, dyn dynamic.Interface, installNS, gw, dir string) (procRecord, error) {
	port, err := FreePort()
	if err != nil {
		return procRecord{}, err
	}
	sc, err := pki.GenerateServingCert(tokenAPIServiceName, []string{tokenAPIServiceName + "." + installNS + ".svc", gw}, 24*time.Hour)
	if err != nil {
		return procRecord{}, err
	}
	certFile, keyFile := filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key")
	if err := writeFiles(map[string][]byte{certFile: sc.CertPEM, keyFile: sc.KeyPEM}); err != nil {
		return procRecord{}, err
	}
	rec, err := c.run("kubefill-apiserver", nil, c.kubefillBin, "apiserver",
		"--kubeconfig="+c.Kubeconfig,
		"--bind-address="+gw,
		"--secure-port="+strconv.Itoa(port),
		"--tls-cert-file="+certFile,
		"--tls-private-key-file="+keyFile,
		"--install-namespace="+installNS,
		// The cluster registers no webhook configurations for it.
		"--disable-admission-webhooks",
	)
	if err != nil {
		return procRecord{}, err
	}
	stop := func(err error) (procRecord, error) { return procRecord{}, errors.Join(err, rec.stop(10*time.Second)) }
	svc, slice, apisvc := TokenAPIObjects(installNS, gw, port, sc.CAPEM)
	if _, err := c.Client.CoreV1().Services(installNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return stop(fmt.Errorf("creating Service %s/%s: %w", installNS, svc.Name, err))
	}
	// No kube-proxy or endpoints controller for host processes: the slice is
	// written by hand.
	slices := c.Client.DiscoveryV1().EndpointSlices(installNS)
	if old, err := slices.Get(ctx, slice.Name, metav1.GetOptions{}); err == nil {
		slice.ResourceVersion = old.ResourceVersion
		_, err = slices.Update(ctx, slice, metav1.UpdateOptions{})
		if err != nil {
			return stop(fmt.Errorf("updating EndpointSlice %s/%s: %w", installNS, slice.Name, err))
		}
	} else if _, err := slices.Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return stop(fmt.Errorf("creating EndpointSlice %s/%s: %w", installNS, slice.Name, err))
	}
	if err := applyAPIService(ctx, dyn, apisvc); err != nil {
		return stop(err)
	}
	if err := waitAPIServiceAvailable(ctx, dyn, rec); err != nil {
		return stop(err)
	}
	return rec, nil
}

// TokenAPIObjects route the upload API group to a `kubefill apiserver` that
// listens at addr:port outside any pod: a Service without a selector, the
// EndpointSlice that kube-apiserver's aggregator (--enable-aggregator-routing)
// dials, and the APIService trusting caPEM.
func TokenAPIObjects(installNS, addr string, port int, caPEM []byte) (*corev1.Service, *discoveryv1.EndpointSlice, *unstructured.Unstructured) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: installNS, Name: tokenAPIServiceName},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt(port), Protocol: corev1.ProtocolTCP}}},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: installNS, Name: tokenAPIServiceName + "-host", Labels: map[string]string{discoveryv1.LabelServiceName: tokenAPIServiceName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	apisvc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1",
		"kind":       "APIService",
		"metadata":   map[string]any{"name": uploadAPIService},
		"spec": map[string]any{
			"service":              map[string]any{"namespace": installNS, "name": tokenAPIServiceName, "port": int64(443)},
			"group":                uploadv1.GroupName,
			"version":              "v1beta1",
			"caBundle":             base64.StdEncoding.EncodeToString(caPEM),
			"groupPriorityMinimum": int64(1000),
			"versionPriority":      int64(15),
		},
	}}
	return svc, slice, apisvc
}

// APIServiceAvailable reads an APIService's Available condition: whether it
// is True, and its message.
func APIServiceAvailable(obj *unstructured.Unstructured) (bool, string) {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == "Available" {
			msg, _ := m["message"].(string)
			return m["status"] == "True", fmt.Sprintf("%v: %s", m["reason"], msg)
		}
	}
	return false, "no Available condition yet"
}

// applyAPIService creates the APIService, replacing an earlier registration
// (another test's install namespace).
func applyAPIService(ctx context.Context, dyn dynamic.Interface, obj *unstructured.Unstructured) error {
	api := dyn.Resource(apiServiceGVR)
	old, err := api.Get(ctx, uploadAPIService, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, obj, metav1.CreateOptions{})
	case err == nil:
		obj.SetResourceVersion(old.GetResourceVersion())
		_, err = api.Update(ctx, obj, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("registering APIService %s: %w", uploadAPIService, err)
	}
	return nil
}

func waitAPIServiceAvailable(ctx context.Context, dyn dynamic.Interface, rec procRecord) error {
	return waitReady(ctx, rec, 90*time.Second, 200*time.Millisecond, "APIService "+uploadAPIService+" never became Available", func(ctx context.Context) (bool, string) {
		obj, err := dyn.Resource(apiServiceGVR).Get(ctx, uploadAPIService, metav1.GetOptions{})
		if err != nil {
			return false, "not read: " + err.Error()
		}
		return APIServiceAvailable(obj)
	})
}

// writeSecretFiles waits up to a minute for a Secret and writes the data
// keys keep selects into dir, one file each, as a volume mount would.
func (c *Cluster) writeSecretFiles(ctx context.Context, ns, name, dir string, keep func(string) bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		s, err := c.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			files := map[string][]byte{}
			for k, v := range s.Data {
				if keep(k) {
					files[filepath.Join(dir, k)] = v
				}
			}
			return writeFiles(files)
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading Secret %s/%s: %w", ns, name, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("Secret %s/%s never appeared", ns, name)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func writeFiles(files map[string][]byte) error {
	for path, data := range files {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// waitHealthy polls url over TLS (verified against caPEM) until it answers 200.
func waitHealthy(ctx context.Context, url string, caPEM []byte, rec procRecord) error {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	return waitReady(ctx, rec, 30*time.Second, 200*time.Millisecond, rec.Name+" not healthy at "+url+" after 30s", func(ctx context.Context) (bool, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, url + " answered " + resp.Status
	})
}
