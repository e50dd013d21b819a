package apiserver

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Only kube-apiserver's webhook client certificate, from a CA the
// authentication ConfigMap names and with an allowed common name, passes.
func TestWebhookCaller(t *testing.T) {
	clientCA, rhCA, other := newCA(t, "client-ca"), newCA(t, "front-proxy-ca"), newCA(t, "some-other-ca")
	cfg, err := ParseAuthConfigMap(authConfigMap(clientCA, rhCA, `["front-proxy-client"]`))
	if err != nil {
		t.Fatal(err)
	}
	onlyClientCA, err := ParseAuthConfigMap(authConfigMap(clientCA, nil, ``))
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"kube-apiserver-webhook-client", "front-proxy-client"}
	for _, c := range []struct {
		name string
		cfg  *AuthConfig
		peer []*x509.Certificate
		want error
	}{
		{"client CA, allowed name", cfg, []*x509.Certificate{clientCA.issue(t, "kube-apiserver-webhook-client", x509.ExtKeyUsageClientAuth)}, nil},
		{"request-header CA, allowed name", cfg, []*x509.Certificate{rhCA.issue(t, "front-proxy-client", x509.ExtKeyUsageClientAuth)}, nil},
		{"no certificate", cfg, nil, ErrNoWebhookClientCert},
		{"another CA, allowed name", cfg, []*x509.Certificate{other.issue(t, "kube-apiserver-webhook-client", x509.ExtKeyUsageClientAuth)}, ErrNoWebhookClientCert},
		{"serving certificate of the client CA", cfg, []*x509.Certificate{clientCA.issue(t, "kube-apiserver-webhook-client", x509.ExtKeyUsageServerAuth)}, ErrNoWebhookClientCert},
		{"client CA, a user's name", cfg, []*x509.Certificate{clientCA.issue(t, "alice", x509.ExtKeyUsageClientAuth, "system:masters")}, ErrWebhookClientName},
		{"request-header CA without a request-header CA configured", onlyClientCA, []*x509.Certificate{rhCA.issue(t, "front-proxy-client", x509.ExtKeyUsageClientAuth)}, ErrNoWebhookClientCert},
		{"configuration not loaded", nil, []*x509.Certificate{clientCA.issue(t, "kube-apiserver-webhook-client", x509.ExtKeyUsageClientAuth)}, ErrNoWebhookClientCert},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.cfg.WebhookCaller(c.peer, names)
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("error %v, want %v", err, c.want)
			}
		})
	}
}

// The handler is not reached, and the body not read, for a refused caller.
func TestRequireWebhookClient(t *testing.T) {
	clientCA := newCA(t, "client-ca")
	cfg, err := ParseAuthConfigMap(authConfigMap(clientCA, nil, ``))
	if err != nil {
		t.Fatal(err)
	}
	auth := &AuthSource{}
	auth.Set(cfg)
	s := &Server{cfg: Config{Auth: auth, WebhookClientNames: []string{"kube-apiserver-webhook-client"}}}
	reached := 0
	h := s.requireWebhookClient(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached++ }))
	for _, c := range []struct {
		name string
		peer []*x509.Certificate
		code int
	}{
		{"kube-apiserver", []*x509.Certificate{clientCA.issue(t, "kube-apiserver-webhook-client", x509.ExtKeyUsageClientAuth)}, http.StatusOK},
		{"anonymous", nil, http.StatusUnauthorized},
		{"a user", []*x509.Certificate{clientCA.issue(t, "system:admin", x509.ExtKeyUsageClientAuth, "system:masters")}, http.StatusForbidden},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := reached
			req := httptest.NewRequest(http.MethodPost, "/datavolume-mutate", strings.NewReader(`{"request":{}}`))
			req.TLS = &tls.ConnectionState{PeerCertificates: c.peer}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != c.code {
				t.Fatalf("status %d, want %d: %s", rec.Code, c.code, rec.Body)
			}
			if passed := reached > before; passed != (c.code == http.StatusOK) {
				t.Fatalf("handler reached %v with status %d", passed, c.code)
			}
			if c.code != http.StatusOK && !strings.Contains(rec.Body.String(), "only kube-apiserver") {
				t.Errorf("body %q does not say who may call", rec.Body)
			}
		})
	}
}
