package apiserver

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

// Errors of WebhookCaller, for errors.Is: the first is answered 401, the
// second 403.
var (
	ErrNoWebhookClientCert = errors.New("no client certificate that chains to a CA of kube-system/extension-apiserver-authentication")
	ErrWebhookClientName   = errors.New("client certificate common name is not an allowed webhook caller")
)

// WebhookCaller decides whether the TLS peer of a webhook call is one of
// names: its certificate must verify, for client authentication, against
// the client CA or the request-header CA of c, and its common name must be
// in names. It returns the common name. Pure but for the certificate
// check.
func (c *AuthConfig) WebhookCaller(peer []*x509.Certificate, names []string) (string, error) {
	if c == nil {
		return "", fmt.Errorf("%w: the authentication configuration is not loaded yet", ErrNoWebhookClientCert)
	}
	if len(peer) == 0 {
		return "", fmt.Errorf("%w: the caller sent none", ErrNoWebhookClientCert)
	}
	leaf := peer[0]
	inter := x509.NewCertPool()
	for _, ic := range peer[1:] {
		inter.AddCert(ic)
	}
	verified := false
	for _, roots := range []*x509.CertPool{c.ClientCA, c.RequestHeaderCA} {
		if roots == nil {
			continue
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
			verified = true
			break
		}
	}
	cn := leaf.Subject.CommonName
	if !verified {
		return "", fmt.Errorf("%w: certificate %q does not verify against the client CA or the request-header CA", ErrNoWebhookClientCert, cn)
	}
	if !slices.Contains(names, cn) {
		return cn, fmt.Errorf("%w: %q is not in --webhook-client-names %v", ErrWebhookClientName, cn, names)
	}
	return cn, nil
}

// requireWebhookClient answers 401 or 403, without reading the body, to a
// webhook call whose TLS peer is not one of WebhookClientNames.
func (s *Server) requireWebhookClient(next http.Handler) http.Handler {
	names := s.cfg.WebhookClientNames
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var peer []*x509.Certificate
		if r.TLS != nil {
			peer = r.TLS.PeerCertificates
		}
		if _, err := s.cfg.Auth.Get().WebhookCaller(peer, names); err != nil {
			code := http.StatusUnauthorized
			if errors.Is(err, ErrWebhookClientName) {
				code = http.StatusForbidden
			}
			s.log.Info("refused a webhook call", "path", r.URL.Path, "remote", r.RemoteAddr, "status", code, "reason", err.Error())
			http.Error(w, "webhook caller refused: "+err.Error()+"; only kube-apiserver, presenting its webhook client certificate, may call the admission webhooks", code)
			return
		}
		next.ServeHTTP(w, r)
	})
}
