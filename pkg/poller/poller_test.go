package poller

import (
	"context"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// serve runs a real registry on loopback; wrap may put a handler in front.
func serve(t *testing.T, wrap func(http.Handler) http.Handler) *httptest.Server {
	t.Helper()
	var h http.Handler = ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func host(srv *httptest.Server) string { return strings.TrimPrefix(srv.URL, "http://") }

func push(t *testing.T, srv *httptest.Server, repoTag string, img v1.Image, opts ...remote.Option) string {
	t.Helper()
	ref, err := name.ParseReference(host(srv)+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, opts...); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func randomImage(t *testing.T) v1.Image {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestDigestFollowsTheTag(t *testing.T) {
	srv := serve(t, nil)
	first := push(t, srv, "os/fedora:latest", randomImage(t))
	url := "docker://" + host(srv) + "/os/fedora:latest"
	got, err := Digest(context.Background(), Registry{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	if got != first {
		t.Fatalf("digest %s, want %s", got, first)
	}
	second := push(t, srv, "os/fedora:latest", randomImage(t))
	if second == first {
		t.Fatal("two random images share a digest")
	}
	if got, err = Digest(context.Background(), Registry{URL: url}); err != nil || got != second {
		t.Fatalf("after a new push: digest %s (%v), want %s", got, err, second)
	}
	// A URL without a tag means latest.
	if got, err = Digest(context.Background(), Registry{URL: "docker://" + host(srv) + "/os/fedora"}); err != nil || got != second {
		t.Fatalf("untagged URL: digest %s (%v), want %s", got, err, second)
	}
}

// A multi-architecture image's digest is the index's, not one
// architecture's manifest: CDI's poller reports the top level.
func TestDigestOfAnIndexIsTheIndexDigest(t *testing.T) {
	srv := serve(t, nil)
	amd, arm := randomImage(t), randomImage(t)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	ref, err := name.ParseReference(host(srv)+"/multi:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	want, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Digest(context.Background(), Registry{URL: "docker://" + host(srv) + "/multi:1"})
	if err != nil {
		t.Fatal(err)
	}
	amdDigest, _ := amd.Digest()
	if got != want.String() {
		t.Fatalf("digest %s, want the index's %s (amd64's manifest is %s)", got, want, amdDigest)
	}
}

// Registries that refuse HEAD on manifests still give their digest by GET.
func TestDigestFallsBackToGet(t *testing.T) {
	heads, refuse := 0, false
	srv := serve(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if refuse && r.Method == http.MethodHead && strings.Contains(r.URL.Path, "/manifests/") {
				heads++
				w.WriteHeader(http.StatusMethodNotAllowed)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	want := push(t, srv, "nohead:1", randomImage(t))
	refuse = true
	got, err := Digest(context.Background(), Registry{URL: "docker://" + host(srv) + "/nohead:1"})
	if err != nil || got != want {
		t.Fatalf("digest %s (%v), want %s", got, err, want)
	}
	if heads == 0 {
		t.Fatal("the poller never tried HEAD")
	}
}

func TestDigestErrorsNameTheURLAndTheCause(t *testing.T) {
	srv := serve(t, nil)
	push(t, srv, "present:1", randomImage(t))
	authed := serve(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "user" || p != "secret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()

	for _, tc := range []struct {
		name string
		reg  Registry
		want error
		text string
	}{
		{"missing tag", Registry{URL: "docker://" + host(srv) + "/present:2"}, ErrNotFound, "present:2"},
		{"missing repository", Registry{URL: "docker://" + host(srv) + "/absent:1"}, ErrNotFound, "absent:1"},
		{"no credentials", Registry{URL: "docker://" + host(authed) + "/private:1"}, ErrUnauthorized, "secretRef"},
		{"wrong credentials", Registry{URL: "docker://" + host(authed) + "/private:1", Username: "user", Password: "wrong"}, ErrUnauthorized, "private:1"},
		{"nothing listens", Registry{URL: "docker://" + closed + "/x:1"}, ErrUnreachable, closed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := Digest(ctx, tc.reg)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.reg.URL) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("error %q does not name %s and %q", err, tc.reg.URL, tc.text)
			}
		})
	}
	// The right credentials pass.
	want := push(t, authed, "private:1", randomImage(t), remote.WithAuth(&authn.Basic{Username: "user", Password: "secret"}))
	got, err := Digest(context.Background(), Registry{URL: "docker://" + host(authed) + "/private:1", Username: "user", Password: "secret"})
	if err != nil || got != want {
		t.Fatalf("with credentials: digest %s (%v), want %s", got, err, want)
	}
}

func TestDigestRefusesOtherSchemes(t *testing.T) {
	for _, u := range []string{"http://example.com/disk.img", "oci-archive:///tmp/x.tar", "quay.io/containerdisks/fedora:40"} {
		if _, err := Digest(context.Background(), Registry{URL: u}); err == nil || !strings.Contains(err.Error(), "docker://") {
			t.Errorf("%s: error %v, want one asking for docker://", u, err)
		}
	}
}

func TestAnnotationUpdate(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name       string
		current    map[string]string
		digest     string
		wantDigest *string
	}{
		{"first poll", nil, "sha256:aaa", ptrTo("sha256:aaa")},
		{"same digest", map[string]string{cdiv1.AnnSourceDesiredDigest: "sha256:aaa"}, "sha256:aaa", nil},
		{"new digest", map[string]string{cdiv1.AnnSourceDesiredDigest: "sha256:aaa"}, "sha256:bbb", ptrTo("sha256:bbb")},
		{"empty digest", map[string]string{cdiv1.AnnSourceDesiredDigest: "sha256:aaa"}, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := AnnotationUpdate(tc.current, tc.digest, now)
			if got := set[cdiv1.AnnLastCronTime]; got == nil || *got != "2026-12-01T10:00:00Z" {
				t.Errorf("lastCronTime %v, want 2026-12-01T10:00:00Z", got)
			}
			got, ok := set[cdiv1.AnnSourceDesiredDigest]
			switch {
			case tc.wantDigest == nil && ok:
				t.Errorf("digest written (%s), want none", *got)
			case tc.wantDigest != nil && (!ok || *got != *tc.wantDigest):
				t.Errorf("digest %v, want %s", got, *tc.wantDigest)
			}
		})
	}
}

// A registry with a private CA: trusted with the CA (-certdir), refused
// without it with a message saying what to add.
func TestDigestOverTLSWithTheRegistryCA(t *testing.T) {
	srv := httptest.NewTLSServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	h := strings.TrimPrefix(srv.URL, "https://")
	ref, err := name.ParseReference(h + "/tls:1")
	if err != nil {
		t.Fatal(err)
	}
	img := randomImage(t)
	if err := remote.Write(ref, img, remote.WithTransport(srv.Client().Transport)); err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	url := "docker://" + h + "/tls:1"
	got, err := Digest(context.Background(), Registry{URL: url, CAPEM: ca})
	if err != nil || got != want.String() {
		t.Fatalf("with the CA: digest %s (%v), want %s", got, err, want)
	}
	if _, err := Digest(context.Background(), Registry{URL: url}); err == nil || !strings.Contains(err.Error(), "certConfigMap") || !strings.Contains(err.Error(), url) {
		t.Fatalf("without the CA: error %v, want one naming the URL and certConfigMap", err)
	}
	if got, err := Digest(context.Background(), Registry{URL: url, InsecureTLS: true}); err != nil || got != want.String() {
		t.Fatalf("insecure: digest %s (%v)", got, err)
	}
}
