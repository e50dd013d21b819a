// Package poller is `kubefill poller`, what a DataImportCron's CronJob runs:
// it reads the top-level manifest digest of a registry image and records it
// on the cron, as CDI's cdi-source-update-poller does. The controller then
// imports the image at that digest.
package poller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Registry says how to reach the registry of a docker:// URL.
type Registry struct {
	// URL is docker://registry/repo[:tag|@digest].
	URL string
	// Username and Password authenticate (CDI's accessKeyId and secretKey).
	Username, Password string
	// CAPEM holds extra CA certificates, trusted besides the system's.
	CAPEM []byte
	// InsecureTLS skips certificate checks and allows plain HTTP.
	InsecureTLS bool
}

// ErrUnauthorized means the registry refused the credentials (or wants some).
var ErrUnauthorized = errors.New("the registry refused access")

// ErrNotFound means the registry has no such repository, tag or digest.
var ErrNotFound = errors.New("the registry has no such image")

// ErrUnreachable means the registry could not be reached at all.
var ErrUnreachable = errors.New("the registry cannot be reached")

// Digest returns the digest of the manifest the URL names at the top level:
// for a multi-architecture image that is the index's digest, as CDI's
// poller reports it, so every architecture's import pins the same thing.
func Digest(ctx context.Context, r Registry) (string, error) {
	ref, ok := strings.CutPrefix(r.URL, "docker://")
	if !ok {
		return "", fmt.Errorf("invalid registry URL %q: the poller reads docker:// URLs only", r.URL)
	}
	var nopts []name.Option
	if r.InsecureTLS {
		nopts = append(nopts, name.Insecure)
	}
	parsed, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return "", fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if len(r.CAPEM) > 0 && !pool.AppendCertsFromPEM(r.CAPEM) {
		return "", fmt.Errorf("%s: the CA bundle holds no PEM certificate", r.URL)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, InsecureSkipVerify: r.InsecureTLS} //nolint:gosec // explicit opt-in
	auth := authn.Anonymous
	if r.Username != "" || r.Password != "" {
		auth = &authn.Basic{Username: r.Username, Password: r.Password}
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(tr), remote.WithAuth(auth)}
	desc, err := remote.Head(parsed, opts...)
	if err != nil {
		// Some registries refuse HEAD on manifests; GET reads the same digest.
		got, gerr := remote.Get(parsed, opts...)
		if gerr != nil {
			return "", explain(r.URL, gerr)
		}
		return got.Digest.String(), nil
	}
	return desc.Digest.String(), nil
}

// explain turns a registry error into one that names the URL and says what
// to fix.
func explain(url string, err error) error {
	var ue x509.UnknownAuthorityError
	var ve *tls.CertificateVerificationError
	if errors.As(err, &ue) || errors.As(err, &ve) || strings.Contains(err.Error(), "x509: ") {
		return fmt.Errorf("%s: the registry's TLS certificate is not trusted; give the cron's registry source a certConfigMap with its CA: %w", url, err)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden:
			return fmt.Errorf("%w: %s answered %d; check the cron's registry secretRef (keys accessKeyId and secretKey): %v",
				ErrUnauthorized, url, te.StatusCode, err)
		case te.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%w: %s: no such repository or tag (404): %v", ErrNotFound, url, err)
		}
		for _, d := range te.Errors {
			switch d.Code {
			case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return fmt.Errorf("%w: %s: %v", ErrUnauthorized, url, err)
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode:
				return fmt.Errorf("%w: %s: %v", ErrNotFound, url, err)
			}
		}
		return fmt.Errorf("reading the manifest of %s: %w", url, err)
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &oe) || errors.As(err, &ne) {
		return fmt.Errorf("%w: %s: %v", ErrUnreachable, url, err)
	}
	return fmt.Errorf("reading the manifest of %s: %w", url, err)
}
