package importer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/datapath"
	"github.com/kubefill/kubefill/pkg/datapath/source"
)

// Paths are the importer pod's file locations; each can be overridden.
type Paths struct {
	DataPath       string // image file on a Filesystem volume
	BlockPath      string // device of a Block volume
	ScratchDir     string // scratch volume; used only if it exists
	TerminationLog string
	// MetricsAddr is where /metrics is served over TLS; empty disables it.
	MetricsAddr             string
	MetricsCert, MetricsKey string
	// OnMetrics, if set, is told the metrics address once it listens.
	OnMetrics func(addr string)
	// CgroupRoot is where the pod's cgroup files are (its memory limit
	// bounds the decompressors); empty means the limit is not known.
	CgroupRoot string
}

// DefaultPaths returns CDI's paths and contract.MetricsPort for metrics.
func DefaultPaths() Paths {
	return Paths{
		DataPath:       contract.DataPath,
		BlockPath:      contract.BlockPath,
		ScratchDir:     contract.ScratchDir,
		TerminationLog: contract.TerminationLog,
		MetricsAddr:    ":" + strconv.Itoa(contract.MetricsPort),
		CgroupRoot:     "/sys/fs/cgroup",
	}
}

// Destination is where the image goes.
type Destination struct {
	Path  string
	Block bool
}

// ChooseDestination picks the Block device when it exists as a device,
// otherwise the image file. It is pure given the stat result.
func ChooseDestination(p Paths, blockMode os.FileMode, blockExists bool) Destination {
	if blockExists && blockMode&os.ModeDevice != 0 {
		return Destination{Path: p.BlockPath, Block: true}
	}
	return Destination{Path: p.DataPath}
}

// ParseHeaders turns "Name: value" lines into a header. Values are never
// echoed in errors, since they may be secrets.
func ParseHeaders(lines []string) (http.Header, error) {
	h := http.Header{}
	for i, l := range lines {
		k, v, ok := strings.Cut(l, ":")
		k = strings.TrimSpace(k)
		if !ok || k == "" || strings.ContainsAny(k, " \t\r\n") || strings.ContainsAny(v, "\r\n") {
			return nil, fmt.Errorf("extra header %d is not of the form \"Name: value\"", i)
		}
		h.Add(textproto.CanonicalMIMEHeaderKey(k), strings.TrimSpace(v))
	}
	return h, nil
}

// SignalContext is the importer's context: SIGTERM (what the kubelet sends
// when the pod is deleted) or an interrupt cancels it, and context.Cause
// then names the signal. Every stage of the data path stops on it, so a
// deleted pod's importer exits at once instead of waiting out its grace
// period.
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, syscall.SIGTERM, os.Interrupt)
}

// Run performs the import described by cfg, serves metrics meanwhile, and
// writes the termination message. It returns the import error, if any.
func Run(ctx context.Context, cfg *Config, p Paths, log logr.Logger) error {
	reg := prometheus.NewRegistry()
	progress, err := NewProgress(reg, cfg.OwnerUID)
	if err != nil {
		return err
	}
	if p.MetricsAddr != "" {
		ms, err := StartMetrics(p.MetricsAddr, p.MetricsCert, p.MetricsKey, reg)
		if err != nil {
			log.Error(err, "metrics disabled")
		} else {
			defer ms.Close()
			log.Info("serving metrics over TLS", "addr", ms.Addr())
			if p.OnMetrics != nil {
				p.OnMetrics(ms.Addr())
			}
		}
	}
	start := time.Now()
	res, runErr := runImport(ctx, cfg, p, log, progress)
	if runErr != nil && ctx.Err() != nil {
		// Stopped from outside (usually the pod being deleted): say so
		// rather than leave a bare "context canceled" from whichever stage
		// was running. Never permanent: the same import may be run again.
		runErr = &InterruptedError{Cause: context.Cause(ctx), Err: runErr}
	}
	msg := contract.TerminationMessage{Outcome: contract.OutcomeSucceeded}
	if runErr != nil {
		// What the DataVolume shows: the user's URL, not the pod's paths.
		text := FailureMessage(runErr.Error(), SourceName(cfg), internalPaths(p))
		msg = contract.TerminationMessage{Outcome: contract.OutcomeFailed, Message: &text}
		var interrupted *InterruptedError
		stopped := errors.As(runErr, &interrupted)
		if Permanent(runErr) && !stopped {
			permanent := true
			msg.Permanent = &permanent
		}
		if errors.Is(runErr, datapath.ErrScratchRequired) && !stopped {
			t := true
			msg.ScratchSpaceRequired = &t
		}
		log.Error(runErr, "import failed")
	} else {
		progress.Set(100)
		text := contract.MessageImportComplete
		prealloc := res.PreallocationApplied
		msg.Message, msg.PreallocationApplied, msg.Labels = &text, &prealloc, res.Labels
		log.Info("import complete", "format", res.Format, "wrappers", res.Wrappers, "method", res.Method,
			"virtualSize", res.VirtualSize, "bytesWritten", res.Written, "preallocated", prealloc,
			"seconds", time.Since(start).Seconds(), "fsyncSeconds", res.SyncTime.Seconds())
	}
	if p.TerminationLog != "" {
		if err := contract.WriteTermination(p.TerminationLog, msg); err != nil {
			log.Error(err, "cannot write termination message")
			if runErr == nil {
				return err
			}
		}
	}
	return runErr
}

// InterruptedError is an import stopped by its context (a signal) before
// it finished. It matches context.Canceled and the stage's own error.
type InterruptedError struct {
	Cause error // why the context ended, e.g. "terminated signal received"
	Err   error // what the running stage returned
}

func (e *InterruptedError) Error() string {
	return fmt.Sprintf("import interrupted before it finished (%v); the partial image is not valid: %v", e.Cause, e.Err)
}

func (e *InterruptedError) Unwrap() []error { return []error{e.Cause, e.Err} }

func runImport(ctx context.Context, cfg *Config, p Paths, log logr.Logger, progress *Progress) (*datapath.Result, error) {
	opt, err := DestinationOptions(p, datapath.ContentType(cfg.ContentType), cfg.ImageSize, cfg.FilesystemOverhead)
	if err != nil {
		return nil, err
	}
	opt.Preallocate, opt.Progress, opt.Log = cfg.Preallocation, progress.Update, log
	if opt.Checksum, err = datapath.ParseChecksum(cfg.Checksum); err != nil {
		return nil, err
	}
	log.Info("starting import", "source", cfg.Source, "contentType", cfg.ContentType, "destination", opt.Path,
		"block", opt.Block, "usableSize", opt.Size, "preallocation", opt.Preallocate, "scratch", opt.ScratchDir)
	if cfg.Source == contract.SourceNone {
		if opt.ContentType == datapath.ContentArchive {
			return nil, errors.New("a blank image cannot have content type archive")
		}
		return datapath.Blank(ctx, opt)
	}
	src, err := buildSource(cfg)
	if err != nil {
		return nil, err
	}
	res, err := datapath.Import(ctx, src, opt)
	if l, ok := src.(interface{ Labels() map[string]string }); ok && err == nil {
		res.Labels = l.Labels()
	}
	return res, err
}

func buildSource(cfg *Config) (source.Source, error) {
	ca, err := source.LoadPEMDir(cfg.CertDir)
	if err != nil {
		return nil, err
	}
	proxyCA, err := source.LoadPEMDir(cfg.ProxyCertDir)
	if err != nil {
		return nil, fmt.Errorf("reading the import proxy's CA: %w", err)
	}
	switch cfg.Source {
	case contract.SourceHTTP:
		lines := append([]string(nil), cfg.ExtraHeaders...)
		dir := cfg.SecretHeadersDir
		if dir == "" {
			dir = contract.SecretHeadersDir
		}
		secret, err := ReadHeaderDir(dir)
		if err != nil {
			return nil, err
		}
		hdr, err := ParseHeaders(append(lines, secret...))
		if err != nil {
			return nil, err
		}
		return source.NewHTTP(source.HTTPConfig{
			URL: cfg.Endpoint, CAPEM: ca, InsecureSkipVerify: cfg.InsecureTLS,
			Username: cfg.AccessKeyID, Password: cfg.SecretKey, Header: hdr,
			HTTPProxy: cfg.HTTPProxy, HTTPSProxy: cfg.HTTPSProxy, NoProxy: cfg.NoProxy, ProxyCAPEM: proxyCA,
		})
	case contract.SourceS3:
		return source.NewS3(source.S3Config{URL: cfg.Endpoint, AccessKey: cfg.AccessKeyID, SecretKey: cfg.SecretKey, CAPEM: ca, InsecureSkipVerify: cfg.InsecureTLS, ProxyCAPEM: proxyCA})
	case contract.SourceRegistry:
		return source.NewRegistry(source.RegistryConfig{URL: cfg.Endpoint, Username: cfg.AccessKeyID, Password: cfg.SecretKey, CAPEM: ca, InsecureSkipVerify: cfg.InsecureTLS, Architecture: cfg.RegistryArch,
			HTTPProxy: cfg.HTTPProxy, HTTPSProxy: cfg.HTTPSProxy, NoProxy: cfg.NoProxy, ProxyCAPEM: proxyCA})
	}
	return nil, fmt.Errorf("unsupported source %q", cfg.Source)
}
