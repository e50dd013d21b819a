package apiserver

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
)

// The ConfigMap kube-apiserver publishes for extension API servers.
const (
	AuthConfigMapNamespace = "kube-system"
	AuthConfigMapName      = "extension-apiserver-authentication"

	keyClientCA              = "client-ca-file"
	keyRequestHeaderCA       = "requestheader-client-ca-file"
	keyRequestHeaderNames    = "requestheader-allowed-names"
	keyRequestHeaderUsername = "requestheader-username-headers"
	keyRequestHeaderUID      = "requestheader-uid-headers"
	keyRequestHeaderGroup    = "requestheader-group-headers"
	keyRequestHeaderExtra    = "requestheader-extra-headers-prefix"
)

// UserInfo is an authenticated caller.
type UserInfo struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string][]string
}

// AuthConfig is what extension-apiserver-authentication says about trust.
type AuthConfig struct {
	// ClientCA verifies ordinary client certificates (user = CN, groups = O).
	ClientCA *x509.CertPool
	// RequestHeaderCA verifies the front proxy's client certificate; nil
	// disables request-header authentication.
	RequestHeaderCA *x509.CertPool
	// AllowedNames are the CNs the front proxy may have; empty allows any CN
	// signed by RequestHeaderCA, as kube-apiserver does.
	AllowedNames      []string
	UsernameHeaders   []string
	UIDHeaders        []string
	GroupHeaders      []string
	ExtraHeaderPrefix []string
}

// ParseAuthConfigMap reads the extension-apiserver-authentication ConfigMap.
// The list values are JSON arrays of strings, as kube-apiserver writes them.
func ParseAuthConfigMap(cm *corev1.ConfigMap) (*AuthConfig, error) {
	cfg := &AuthConfig{}
	if pemData := cm.Data[keyClientCA]; pemData != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(pemData)) {
			return nil, fmt.Errorf("%s/%s: %s holds no PEM certificate", cm.Namespace, cm.Name, keyClientCA)
		}
		cfg.ClientCA = pool
	}
	if pemData := cm.Data[keyRequestHeaderCA]; pemData != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(pemData)) {
			return nil, fmt.Errorf("%s/%s: %s holds no PEM certificate", cm.Namespace, cm.Name, keyRequestHeaderCA)
		}
		cfg.RequestHeaderCA = pool
	}
	lists := []struct {
		key string
		dst *[]string
	}{
		{keyRequestHeaderNames, &cfg.AllowedNames},
		{keyRequestHeaderUsername, &cfg.UsernameHeaders},
		{keyRequestHeaderUID, &cfg.UIDHeaders},
		{keyRequestHeaderGroup, &cfg.GroupHeaders},
		{keyRequestHeaderExtra, &cfg.ExtraHeaderPrefix},
	}
	for _, l := range lists {
		raw := strings.TrimSpace(cm.Data[l.key])
		if raw == "" || raw == "null" {
			continue
		}
		if err := json.Unmarshal([]byte(raw), l.dst); err != nil {
			return nil, fmt.Errorf("%s/%s: %s is not a JSON list of strings: %w", cm.Namespace, cm.Name, l.key, err)
		}
	}
	if cfg.RequestHeaderCA != nil && len(cfg.UsernameHeaders) == 0 {
		return nil, fmt.Errorf("%s/%s: %s is set but %s is empty", cm.Namespace, cm.Name, keyRequestHeaderCA, keyRequestHeaderUsername)
	}
	return cfg, nil
}

// ErrUnauthenticated means the request proved no identity we trust.
var ErrUnauthenticated = errors.New("unauthenticated")

// Authenticate decides who sent r, following kube-apiserver's rules for an
// aggregated server: identity headers count only on a connection whose client
// certificate chains to the request-header CA and has an allowed CN; otherwise
// a client certificate from the client CA names the user; otherwise nobody.
func (c *AuthConfig) Authenticate(r *http.Request) (*UserInfo, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: authentication configuration not loaded yet", ErrUnauthenticated)
	}
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil, fmt.Errorf("%w: no client certificate", ErrUnauthenticated)
	}
	leaf := r.TLS.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, ic := range r.TLS.PeerCertificates[1:] {
		inter.AddCert(ic)
	}
	verify := func(roots *x509.CertPool) bool {
		if roots == nil {
			return false
		}
		_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		return err == nil
	}
	if verify(c.RequestHeaderCA) {
		if len(c.AllowedNames) > 0 && !slices.Contains(c.AllowedNames, leaf.Subject.CommonName) {
			return nil, fmt.Errorf("%w: front-proxy certificate CN %q is not in %s", ErrUnauthenticated, leaf.Subject.CommonName, keyRequestHeaderNames)
		}
		user := firstHeader(r.Header, c.UsernameHeaders)
		if user == "" {
			return nil, fmt.Errorf("%w: front-proxy request without a user name header", ErrUnauthenticated)
		}
		info := &UserInfo{Name: user, UID: firstHeader(r.Header, c.UIDHeaders)}
		for _, h := range c.GroupHeaders {
			info.Groups = append(info.Groups, r.Header.Values(h)...)
		}
		info.Extra = extraFromHeaders(r.Header, c.ExtraHeaderPrefix)
		return info, nil
	}
	if verify(c.ClientCA) {
		if leaf.Subject.CommonName == "" {
			return nil, fmt.Errorf("%w: client certificate without a CN", ErrUnauthenticated)
		}
		return &UserInfo{Name: leaf.Subject.CommonName, Groups: append([]string(nil), leaf.Subject.Organization...)}, nil
	}
	return nil, fmt.Errorf("%w: client certificate %q is not signed by a trusted CA", ErrUnauthenticated, leaf.Subject.CommonName)
}

func firstHeader(h http.Header, names []string) string {
	for _, n := range names {
		if v := strings.TrimSpace(h.Get(n)); v != "" {
			return v
		}
	}
	return ""
}

// extraFromHeaders collects X-Remote-Extra-<key> headers; the key is
// lower-cased and percent-unescaped as kube-apiserver encodes it.
func extraFromHeaders(h http.Header, prefixes []string) map[string][]string {
	var extra map[string][]string
	for name, values := range h {
		lname := strings.ToLower(name)
		for _, p := range prefixes {
			lp := strings.ToLower(p)
			if !strings.HasPrefix(lname, lp) || len(lname) == len(lp) {
				continue
			}
			key := lname[len(lp):]
			if k, err := url.PathUnescape(key); err == nil {
				key = k
			}
			if extra == nil {
				extra = map[string][]string{}
			}
			extra[key] = append(extra[key], values...)
		}
	}
	return extra
}

// AuthSource holds the current AuthConfig; a watcher swaps it as the
// ConfigMap changes.
type AuthSource struct {
	cur atomic.Pointer[AuthConfig]
}

// Set replaces the configuration.
func (s *AuthSource) Set(c *AuthConfig) { s.cur.Store(c) }

// Get returns the configuration, nil until the first load.
func (s *AuthSource) Get() *AuthConfig { return s.cur.Load() }

// Authenticate uses the current configuration.
func (s *AuthSource) Authenticate(r *http.Request) (*UserInfo, error) {
	return s.Get().Authenticate(r)
}
