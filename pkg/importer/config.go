// Package importer is the job that runs as `kubefill importer` inside an
// importer pod. It reads its job from environment variables, as CDI's
// importer pod does, runs the data path, serves progress metrics over TLS
// and writes a JSON termination message.
//
// The environment variables, paths, metrics port and termination message
// are the worker contract, defined in pkg/contract (contract.Env*,
// contract.Source*, contract.TerminationMessage) so that the controller
// sets them without importing this package. Their names mirror CDI's
// importer pod:
//
//	IMPORTER_SOURCE         http | s3 | registry | none (blank); default http
//	IMPORTER_ENDPOINT       the URL: http(s)://..., s3://bucket/key or an
//	                        http(s) S3 URL, docker://... or oci-archive://...
//	IMPORTER_CONTENTTYPE    kubevirt (default) | archive
//	IMPORTER_IMAGE_SIZE     requested size, a Kubernetes quantity (e.g. 10Gi)
//	IMPORTER_ACCESS_KEY_ID  basic-auth user, S3 access key or registry user
//	IMPORTER_SECRET_KEY     basic-auth password, S3 secret or registry password
//	IMPORTER_CERT_DIR       directory of PEM CA certificates for the endpoint
//	INSECURE_TLS            "true" skips TLS verification of the endpoint
//	IMPORTER_PROXY_CERT_DIR directory of PEM CA certificates for the proxy
//	http_proxy, https_proxy, no_proxy   proxy settings (upper case accepted)
//	IMPORTER_EXTRA_HEADER_<n>           one "Name: value" extra HTTP header each
//	IMPORTER_SECRET_EXTRA_HEADERS_DIR   directory whose files each hold one
//	                        "Name: value" header (CDI mounts them at /extraheaders)
//	IMPORTER_CHECKSUM       "algo:hex" digest of the source (md5, sha1, sha256, sha512)
//	IMPORTER_REGISTRY_IMAGE_ARCHITECTURE  platform architecture for registry images
//	FILESYSTEM_OVERHEAD     fraction of a Filesystem volume kept free (default 0.06)
//	PREALLOCATION           "true" preallocates the image
//	OWNER_UID               UID label for the progress metric
//
// IMPORTER_CHECKSUM, IMPORTER_SECRET_EXTRA_HEADERS_DIR and
// IMPORTER_REGISTRY_IMAGE_ARCHITECTURE are Kubefill's names; the others are
// CDI's.
package importer

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubefill/kubefill/pkg/contract"
)

// Config is one import job.
type Config struct {
	Source       string
	Endpoint     string
	ContentType  string
	ImageSize    int64 // 0 when not given
	AccessKeyID  string
	SecretKey    string
	CertDir      string
	InsecureTLS  bool
	ProxyCertDir string
	HTTPProxy    string
	HTTPSProxy   string
	NoProxy      string
	// ExtraHeaders are "Name: value" lines, from the environment and the
	// secret headers directory.
	ExtraHeaders       []string
	SecretHeadersDir   string
	Checksum           string
	RegistryArch       string
	FilesystemOverhead float64
	Preallocation      bool
	OwnerUID           string
}

// ConfigFromEnv reads a Config through getenv (os.Getenv in production),
// with environ listing all variables (for the numbered extra headers).
func ConfigFromEnv(getenv func(string) string, environ []string) (*Config, error) {
	c := &Config{
		Source:           strings.ToLower(getenv(contract.EnvSource)),
		Endpoint:         getenv(contract.EnvEndpoint),
		ContentType:      strings.ToLower(getenv(contract.EnvContentType)),
		AccessKeyID:      getenv(contract.EnvAccessKeyID),
		SecretKey:        getenv(contract.EnvSecretKey),
		CertDir:          getenv(contract.EnvCertDir),
		ProxyCertDir:     getenv(contract.EnvProxyCertDir),
		HTTPProxy:        first(getenv(contract.EnvHTTPProxy), getenv(strings.ToUpper(contract.EnvHTTPProxy))),
		HTTPSProxy:       first(getenv(contract.EnvHTTPSProxy), getenv(strings.ToUpper(contract.EnvHTTPSProxy))),
		NoProxy:          first(getenv(contract.EnvNoProxy), getenv(strings.ToUpper(contract.EnvNoProxy))),
		SecretHeadersDir: getenv(contract.EnvSecretExtraHeadersDir),
		Checksum:         getenv(contract.EnvChecksum),
		RegistryArch:     getenv(contract.EnvRegistryArchitecture),
		OwnerUID:         getenv(contract.EnvOwnerUID),
	}
	if c.Source == "" {
		c.Source = contract.SourceHTTP
	}
	switch c.Source {
	case contract.SourceHTTP, contract.SourceS3, contract.SourceRegistry, contract.SourceNone:
	default:
		return nil, fmt.Errorf("%s=%q is not supported (use http, s3, registry or none)", contract.EnvSource, c.Source)
	}
	if c.ContentType == "" {
		c.ContentType = "kubevirt"
	}
	if c.ContentType != "kubevirt" && c.ContentType != "archive" {
		return nil, fmt.Errorf("%s=%q is not supported (use kubevirt or archive)", contract.EnvContentType, c.ContentType)
	}
	if c.Source != contract.SourceNone && c.Endpoint == "" {
		return nil, fmt.Errorf("%s is required for source %s", contract.EnvEndpoint, c.Source)
	}
	if s := getenv(contract.EnvImageSize); s != "" {
		q, err := resource.ParseQuantity(s)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", contract.EnvImageSize, s, err)
		}
		c.ImageSize = q.Value()
		if c.ImageSize < 0 {
			return nil, fmt.Errorf("%s=%q is negative", contract.EnvImageSize, s)
		}
	}
	var err error
	if c.InsecureTLS, err = parseBool(getenv, contract.EnvInsecureTLS); err != nil {
		return nil, err
	}
	if c.Preallocation, err = parseBool(getenv, contract.EnvPreallocation); err != nil {
		return nil, err
	}
	c.FilesystemOverhead = contract.DefaultFilesystemOverhead
	if s := getenv(contract.EnvFilesystemOverhead); s != "" {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f < 0 || f >= 1 || math.IsNaN(f) {
			return nil, fmt.Errorf("%s=%q must be a fraction in [0, 1)", contract.EnvFilesystemOverhead, s)
		}
		c.FilesystemOverhead = f
	}
	var names []string
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, contract.EnvExtraHeaderPrefix) {
			names = append(names, k)
			_ = v
		}
	}
	sort.Strings(names)
	for _, k := range names {
		c.ExtraHeaders = append(c.ExtraHeaders, getenv(k))
	}
	return c, nil
}

func first(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

func parseBool(getenv func(string) string, name string) (bool, error) {
	s := getenv(name)
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("%s=%q must be true or false", name, s)
	}
	return b, nil
}

// UsableSize returns the bytes a Filesystem-volume image may occupy:
// the smaller of the requested size and the space available, minus the
// filesystem overhead, rounded down to 512 bytes (as CDI computes it).
// requested or available may be 0 (unknown).
func UsableSize(requested, available int64, overhead float64) int64 {
	space := requested
	if space == 0 || (available > 0 && available < space) {
		space = available
	}
	if space <= 0 {
		return 0
	}
	usable := int64(math.Floor((1 - overhead) * float64(space)))
	return usable / 512 * 512
}

// ReadHeaderDir reads "Name: value" headers from every regular file in dir.
func ReadHeaderDir(dir string) ([]string, error) {
	if dir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading secret extra headers: %w", err)
	}
	var out []string
	var walk func(string) error
	walk = func(d string) error {
		ents, err := os.ReadDir(d)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") {
				continue
			}
			p := filepath.Join(d, e.Name())
			st, err := os.Stat(p)
			if err != nil {
				continue
			}
			if st.IsDir() {
				if err := walk(p); err != nil {
					return err
				}
				continue
			}
			if !st.Mode().IsRegular() || st.Size() > 64<<10 {
				continue
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if line := strings.TrimSpace(sc.Text()); line != "" {
					out = append(out, line)
				}
			}
			f.Close()
		}
		return nil
	}
	_ = entries
	if err := walk(dir); err != nil {
		return nil, fmt.Errorf("reading secret extra headers: %w", err)
	}
	return out, nil
}
