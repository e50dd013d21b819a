package source

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config configures an S3 source.
type S3Config struct {
	// URL is s3://bucket/key (AWS, endpoint s3.amazonaws.com) or
	// http(s)://endpoint[:port]/bucket/key (path-style, any S3 server).
	URL                  string
	AccessKey, SecretKey string
	CAPEM                []byte
	InsecureSkipVerify   bool
	Region               string
	// ProxyCAPEM holds the CA certificates of a TLS-intercepting proxy
	// (the proxy itself comes from the environment).
	ProxyCAPEM []byte
	// MaxRetries bounds the client's retries of failed requests (default 10).
	MaxRetries int
}

// S3 reads one object from an S3-compatible store. It is a Ranger.
type S3 struct {
	client      *minio.Client
	bucket, key string
	endpoint    string
	size        int64
}

// ParseS3URL splits an S3 endpoint URL into endpoint, TLS, bucket and key.
// It is pure.
func ParseS3URL(raw string) (endpoint string, secure bool, bucket, key string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", false, "", "", fmt.Errorf("invalid S3 URL: %w", err)
	}
	path := strings.TrimPrefix(u.Path, "/")
	switch u.Scheme {
	case "s3":
		endpoint, secure, bucket, key = "s3.amazonaws.com", true, u.Host, path
	case "http", "https":
		endpoint, secure = u.Host, u.Scheme == "https"
		bucket, key, _ = strings.Cut(path, "/")
	default:
		return "", false, "", "", fmt.Errorf("invalid S3 URL %q: scheme must be s3, http or https", u.Redacted())
	}
	if bucket == "" || key == "" || strings.HasSuffix(key, "/") {
		return "", false, "", "", fmt.Errorf("invalid S3 URL %q: it must name a bucket and an object", u.Redacted())
	}
	return endpoint, secure, bucket, key, nil
}

// NewS3 builds an S3 source.
func NewS3(cfg S3Config) (*S3, error) {
	endpoint, secure, bucket, key, err := ParseS3URL(cfg.URL)
	if err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if len(cfg.CAPEM) > 0 && !pool.AppendCertsFromPEM(cfg.CAPEM) {
		return nil, errors.New("the custom CA bundle contains no valid PEM certificate")
	}
	if len(cfg.ProxyCAPEM) > 0 && !pool.AppendCertsFromPEM(cfg.ProxyCAPEM) {
		return nil, errors.New("the proxy CA bundle contains no valid PEM certificate")
	}
	tr := &http.Transport{
		Proxy:              http.ProxyFromEnvironment,
		TLSClientConfig:    &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, InsecureSkipVerify: cfg.InsecureSkipVerify}, //nolint:gosec // explicit opt-in
		DisableCompression: true,
	}
	var creds *credentials.Credentials
	if cfg.AccessKey != "" || cfg.SecretKey != "" {
		creds = credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, "")
	} else {
		creds = credentials.New(&credentials.IAM{})
	}
	c, err := minio.New(endpoint, &minio.Options{Creds: creds, Secure: secure, Transport: tr, Region: cfg.Region, BucketLookup: minio.BucketLookupPath, MaxRetries: cfg.MaxRetries})
	if err != nil {
		return nil, fmt.Errorf("creating S3 client: %w", err)
	}
	return &S3{client: c, bucket: bucket, key: key, endpoint: endpoint, size: -1}, nil
}

// String implements Source.
func (s *S3) String() string { return "s3 " + s.endpoint + "/" + s.bucket + "/" + s.key }

// Size implements Source.
func (s *S3) Size() int64 { return s.size }

// CanRange implements Ranger.
func (s *S3) CanRange() bool { return s.size >= 0 }

// Open implements Source.
func (s *S3) Open(ctx context.Context) (io.ReadCloser, error) {
	st, err := s.client.StatObject(ctx, s.bucket, s.key, minio.StatObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s, describeS3(err))
	}
	s.size = st.Size
	obj, err := s.client.GetObject(ctx, s.bucket, s.key, minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s, describeS3(err))
	}
	return obj, nil
}

// OpenRange implements Ranger.
func (s *S3) OpenRange(ctx context.Context, off, n int64) (io.ReadCloser, error) {
	opts := minio.GetObjectOptions{}
	if err := opts.SetRange(off, off+n-1); err != nil {
		return nil, err
	}
	obj, err := s.client.GetObject(ctx, s.bucket, s.key, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s, describeS3(err))
	}
	return obj, nil
}

func describeS3(err error) error {
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch":
		return &StatusError{Code: http.StatusForbidden, Msg: "access denied (check the credentials in the secret): " + err.Error()}
	case "NoSuchKey", "NoSuchBucket":
		return &StatusError{Code: http.StatusNotFound, Msg: "not found (check the URL): " + err.Error()}
	}
	return err
}
