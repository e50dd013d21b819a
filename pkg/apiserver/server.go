// Package apiserver is Kubefill's aggregated API server for
// upload.cdi.kubevirt.io/v1beta1 (UploadTokenRequest) and the host of its
// admission webhooks. It authenticates like a kube-aggregator backend (from
// kube-system/extension-apiserver-authentication) and authorises through
// SubjectAccessReviews.
package apiserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	restful "github.com/emicklei/go-restful/v3"
	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"

	"github.com/kubefill/kubefill/pkg/pki"
	"github.com/kubefill/kubefill/pkg/token"
)

// Config is what the handler needs; every field is required except Webhooks and Ready.
type Config struct {
	Kube         kubernetes.Interface
	Auth         *AuthSource
	Authorizer   Authorizer
	UploadTokens token.Generator
	// Webhooks maps a path such as /datavolume-validate to its handler.
	Webhooks map[string]http.Handler
	// WebhookClientNames, when not empty, admits to the webhook paths only
	// a caller with a client certificate that chains to the client CA or
	// the request-header CA of Auth and whose common name is one of these:
	// kube-apiserver, configured to present it (an AdmissionConfiguration
	// kubeconfig). Empty: anyone who reaches the port may call them, as
	// with CDI.
	WebhookClientNames []string
	// Ready reports readiness beyond "authentication configuration loaded".
	Ready func() error
}

// Server is the HTTP side of the aggregated API server.
type Server struct {
	cfg       Config
	log       logr.Logger
	container *restful.Container
}

// NewServer builds the routes.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Kube == nil || cfg.Auth == nil || cfg.Authorizer == nil || cfg.UploadTokens == nil {
		return nil, errors.New("apiserver: Kube, Auth, Authorizer and UploadTokens are required")
	}
	s := &Server{cfg: cfg, log: logf.Log.WithName("apiserver"), container: restful.NewContainer()}
	s.container.ServeMux = http.NewServeMux()
	s.container.Router(restful.CurlyRouter{})
	s.container.DoNotRecover(false)

	apis := new(restful.WebService).Path("/apis").Produces(restful.MIME_JSON)
	apis.Route(apis.GET("").To(s.getAPIGroupList).Doc("list API groups").Writes(metav1.APIGroupList{}))
	apis.Route(apis.GET("/" + uploadv1.GroupName).To(s.getAPIGroup).Doc("describe the upload API group").Writes(metav1.APIGroup{}))
	s.container.Add(apis)

	gv := new(restful.WebService).Path("/apis/" + uploadv1.SchemeGroupVersion.String()).Produces(restful.MIME_JSON)
	gv.Route(gv.GET("").To(s.getAPIResourceList).Doc("list resources of upload.cdi.kubevirt.io/v1beta1").Writes(metav1.APIResourceList{}))
	s.uploadTokenRoutes(gv)
	s.container.Add(gv)

	misc := new(restful.WebService).Path("/")
	misc.Route(misc.GET("/healthz").To(s.healthz).Produces("text/plain"))
	misc.Route(misc.GET("/livez").To(s.healthz).Produces("text/plain"))
	misc.Route(misc.GET("/readyz").To(s.readyz).Produces("text/plain"))
	misc.Route(misc.GET("/openapi/v2").To(s.openAPIV2).Produces(restful.MIME_JSON))
	misc.Route(misc.GET("/openapi/v3").To(s.openAPIV3Index).Produces(restful.MIME_JSON))
	misc.Route(misc.GET("/openapi/v3/apis/{group}/{version}").To(s.openAPIV3GroupVersion).Produces(restful.MIME_JSON))
	s.container.Add(misc)

	for path, h := range cfg.Webhooks {
		if len(cfg.WebhookClientNames) > 0 {
			h = s.requireWebhookClient(h)
		}
		s.container.Handle(path, h)
	}
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.container.ServeHTTP(w, r) }

func (s *Server) healthz(_ *restful.Request, resp *restful.Response) {
	_, _ = resp.Write([]byte("ok"))
}

func (s *Server) readyz(_ *restful.Request, resp *restful.Response) {
	if err := s.readiness(); err != nil {
		resp.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(resp, "not ready: %v", err)
		return
	}
	_, _ = resp.Write([]byte("ok"))
}

func (s *Server) readiness() error {
	if s.cfg.Auth.Get() == nil {
		return fmt.Errorf("%w: %s/%s not loaded", errNotReady, AuthConfigMapNamespace, AuthConfigMapName)
	}
	if s.cfg.Ready != nil {
		return s.cfg.Ready()
	}
	return nil
}

// Options configure Run.
type Options struct {
	BindAddress string
	SecurePort  int
	// CertFile and KeyFile serve a certificate from files, reloaded when they
	// change. If both are empty a certificate is generated for GeneratedHosts.
	CertFile, KeyFile string
	GeneratedHosts    []string
	// GeneratedCAFile, if set, receives the CA of a generated certificate.
	GeneratedCAFile string
	// Listener, if set, is used instead of BindAddress:SecurePort (tests).
	Listener net.Listener
	// OnListen is called with the bound address before serving.
	OnListen func(addr net.Addr)
}

// TLSConfig returns a server TLS configuration per opts. Client certificates
// are requested but not verified by the TLS layer: the trusted CAs come from a
// ConfigMap that changes, so Authenticate verifies them per request.
func TLSConfig(opts Options) (*tls.Config, error) {
	cfg, err := pki.ServerTLS(pki.ServingOptions{
		CertFile: opts.CertFile, KeyFile: opts.KeyFile,
		GeneratedName: "kubefill-apiserver", GeneratedHosts: opts.GeneratedHosts, GeneratedCAFile: opts.GeneratedCAFile,
	})
	if err != nil {
		return nil, err
	}
	cfg.ClientAuth = tls.RequestClientCert
	return cfg, nil
}

// Serve listens with TLS and serves until ctx ends.
func (s *Server) Serve(ctx context.Context, opts Options, tlsCfg *tls.Config) error {
	ln := opts.Listener
	if ln == nil {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(opts.BindAddress, fmt.Sprint(opts.SecurePort)))
		if err != nil {
			return fmt.Errorf("listening on %s:%d: %w", opts.BindAddress, opts.SecurePort, err)
		}
	}
	if opts.OnListen != nil {
		opts.OnListen(ln.Addr())
	}
	srv := &http.Server{
		Handler:           s,
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       90 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	s.log.Info("serving", "address", ln.Addr().String())
	select {
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			return fmt.Errorf("shutting down: %w", err)
		}
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("serving: %w", err)
	}
}
