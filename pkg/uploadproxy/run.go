package uploadproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kubefill/kubefill/pkg/pki"
	"github.com/kubefill/kubefill/pkg/token"
)

// Ways to reach an upload pod.
const (
	AddressPodIP   = "pod-ip"
	AddressService = "service"
)

// RunOptions configure Run; the command line fills them.
type RunOptions struct {
	BindAddress string
	SecurePort  int
	// CertFile and KeyFile are the user-facing serving certificate, reloaded
	// when they change. Both empty: a self-signed one for GeneratedHosts.
	CertFile, KeyFile string
	GeneratedHosts    []string
	// SigningKeyDir is the mounted signing key Secret (id_rsa.pub, and
	// id_rsa.pub.previous with rotated-at after a rotation).
	SigningKeyDir string
	TokenLeeway   time.Duration
	// Upstream is the proxy's identity towards upload servers.
	Upstream UpstreamTLS
	// Address is AddressPodIP or AddressService; UpstreamPort the port to use.
	Address      string
	UpstreamPort int
	// PodWait bounds how long a request waits for the upload pod to be ready.
	PodWait time.Duration
	// UploadServerCAConfigMap, if set, names a ConfigMap in Namespace whose
	// ca-bundle.crt (the upload-server signer's bundle) is trusted for upload
	// servers besides Upstream.CAFile, read through the API at most once a
	// second: an upload pod signed by a just-rotated signer is trusted at
	// once, not only after kubelet updates the mounted file.
	UploadServerCAConfigMap string
	// Namespace holds UploadServerCAConfigMap (the install namespace).
	Namespace string
	// Listener, if set, replaces BindAddress:SecurePort (tests).
	Listener net.Listener
}

// Validate checks the options without touching files or the network.
func (o *RunOptions) Validate() error {
	var errs []error
	if o.Listener == nil && (o.SecurePort <= 0 || o.SecurePort > 65535) {
		errs = append(errs, fmt.Errorf("--secure-port %d is not a TCP port", o.SecurePort))
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		errs = append(errs, errors.New("--tls-cert-file and --tls-private-key-file go together"))
	}
	if o.SigningKeyDir == "" {
		errs = append(errs, errors.New("--signing-key-dir is required: mount the public keys of the apiserver's signing key Secret (id_rsa.pub) there"))
	}
	if o.Upstream.ClientCertFile == "" || o.Upstream.ClientKeyFile == "" || o.Upstream.CAFile == "" {
		errs = append(errs, errors.New("--client-cert-file, --client-key-file and --upload-server-ca-file are required: the proxy talks mutual TLS to upload pods"))
	}
	if o.Address != AddressPodIP && o.Address != AddressService {
		errs = append(errs, fmt.Errorf("--upload-server-address must be %q or %q, not %q", AddressPodIP, AddressService, o.Address))
	}
	if o.UpstreamPort <= 0 || o.UpstreamPort > 65535 {
		errs = append(errs, fmt.Errorf("--upload-server-port %d is not a TCP port", o.UpstreamPort))
	}
	if o.UploadServerCAConfigMap != "" && o.Namespace == "" {
		errs = append(errs, fmt.Errorf("--upload-server-ca-configmap %s needs the install namespace (POD_NAMESPACE)", o.UploadServerCAConfigMap))
	}
	if o.PodWait < 0 {
		errs = append(errs, fmt.Errorf("--pod-ready-timeout %s is negative", o.PodWait))
	}
	return errors.Join(errs...)
}

// Run serves the upload proxy until ctx ends.
func Run(ctx context.Context, restCfg *rest.Config, o RunOptions) error {
	if err := o.Validate(); err != nil {
		return err
	}
	log := logf.FromContext(ctx).WithName("uploadproxy")
	keys := &token.DirKeySource{Dir: o.SigningKeyDir, Window: token.DefaultUploadTokenLifetime + o.TokenLeeway}
	if _, err := keys.PublicKeys(); err != nil {
		return fmt.Errorf("reading the token signing keys from %s: %w", o.SigningKeyDir, err)
	}
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("building the Kubernetes client: %w", err)
	}
	var loc Locator = PodIPLocator{Client: kube, Port: o.UpstreamPort}
	if o.Address == AddressService {
		loc = ServiceLocator{Port: o.UpstreamPort}
	}
	if o.UploadServerCAConfigMap != "" {
		o.Upstream.ExtraCAs = (&configMapBundle{client: kube, namespace: o.Namespace, name: o.UploadServerCAConfigMap, log: log}).get
	}
	tr, err := NewUpstreamTransport(o.Upstream)
	if err != nil {
		return err
	}
	h, err := NewHandler(Options{
		Validator: token.NewMultiKeyValidator(token.UploadTokenIssuer, keys.PublicKeys, o.TokenLeeway),
		Resolver:  &KubeResolver{Client: kube, Locator: loc, Wait: o.PodWait},
		Transport: tr,
		Log:       log,
	})
	if err != nil {
		return err
	}
	// Users do not present client certificates here (ServerTLS asks for none).
	tlsCfg, err := pki.ServerTLS(pki.ServingOptions{CertFile: o.CertFile, KeyFile: o.KeyFile, GeneratedName: "kubefill-uploadproxy", GeneratedHosts: o.GeneratedHosts})
	if err != nil {
		return fmt.Errorf("upload proxy serving certificate: %w", err)
	}
	ln := o.Listener
	if ln == nil {
		ln, err = net.Listen("tcp", net.JoinHostPort(o.BindAddress, strconv.Itoa(o.SecurePort)))
		if err != nil {
			return fmt.Errorf("listening: %w", err)
		}
	}
	log.Info("serving uploads", "address", ln.Addr().String(), "uploadServers", o.Address, "podReadyTimeout", o.PodWait)
	return Serve(ctx, NewServer(h, tlsCfg), ln, 30*time.Second)
}

// configMapBundle reads a CA bundle ConfigMap's ca-bundle.crt, at most once
// a second; a failed read keeps the last bundle.
type configMapBundle struct {
	client          kubernetes.Interface
	namespace, name string
	log             logr.Logger

	mu      sync.Mutex
	pem     []byte
	fetched time.Time
}

func (b *configMapBundle) get(ctx context.Context) []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if time.Since(b.fetched) < time.Second {
		return b.pem
	}
	b.fetched = time.Now()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cm, err := b.client.CoreV1().ConfigMaps(b.namespace).Get(rctx, b.name, metav1.GetOptions{})
	if err != nil {
		b.log.Error(err, "reading the upload-server CA bundle; keeping the last one", "configMap", b.namespace+"/"+b.name)
		return b.pem
	}
	b.pem = []byte(cm.Data["ca-bundle.crt"])
	return b.pem
}
