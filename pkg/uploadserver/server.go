// Package uploadserver is `kubefill uploadserver`, the server inside an
// upload pod. It accepts one disk image over mutual TLS (the upload proxy
// presents a client certificate from the proxy's client CA), streams it
// through the same data path as the importer (format detection,
// decompression, qcow2 and other formats, sparse bounded writes, resize,
// checksum, the same refusals of hostile images) and exits once the data
// is durable on the volume, leaving a JSON termination message.
//
// Paths follow CDI's upload server: /v1beta1/upload (synchronous),
// /v1beta1/upload-async, /v1beta1/upload-form and /v1beta1/upload-form-async
// (multipart part "file"), /v1beta1/upload-archive, the same under
// /v1alpha1, and /healthz. A second upload while one runs gets 503; an
// upload after a successful one gets 409. A bad upload gets a 4xx with the
// reason, and the server stays ready for another try.
//
// It is also the target of a host-assisted clone (see clone.go): a POST to
// /v1beta1/upload with x-cdi-content-type blockdevice-clone or
// filesystem-clone, from the client certificate named by ClientName, is a
// clone stream written through cloner.ReceiveStream.
//
// contract.UploadOutcomePath tells the controller, before the pod exits,
// that an upload succeeded (outcome.go).
//
// /metrics, like /healthz, needs no client certificate: it publishes
// kubevirt_cdi_import_progress_total{ownerUID}, the percentage of the
// current upload's body received (of its Content-Length; 0 while none runs,
// or when the length is unknown; back to 0 after a failed upload; never
// 100 before the data is on disk), which the controller reads into the
// DataVolume's progress.
package uploadserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/datapath"
	"github.com/kubefill/kubefill/pkg/datapath/source"
	"github.com/kubefill/kubefill/pkg/importer"
)

// Config is one upload server.
type Config struct {
	// Addr is the TLS listen address, e.g. ":8443".
	Addr string
	// CertFile and KeyFile are the serving certificate; ClientCAFile holds
	// the CA bundle client certificates must chain to (the proxy's client CA).
	CertFile, KeyFile, ClientCAFile string
	// ClientName is the common name the client certificate must have
	// (required). The upload proxy's name makes an ordinary upload server;
	// a clone's name, <srcNs>/<srcName>-<tgtNs>/<tgtName> (it holds a "/",
	// which no other client name does), makes the server a clone target:
	// it then takes that clone's stream and nothing else. The controller
	// pairs each with its signer in ClientCAFile: the upload proxy's client
	// signer for an ordinary server, the clone client signer for a clone's.
	ClientName string
	// Paths are the data, block, scratch and termination-log locations.
	Paths importer.Paths
	// ContentType is the volume's content type: kubevirt or archive. The
	// upload-archive path always extracts an archive.
	ContentType        string
	ImageSize          int64
	FilesystemOverhead float64
	Preallocation      bool
	// Checksum is an optional "algo:hex" digest every upload must match.
	Checksum string
	// OwnerUID labels the progress metric.
	OwnerUID string
	// OnListen, if set, is told the address once the server listens.
	OnListen func(addr string)

	// blockFile makes a clone treat Paths.BlockPath as the Block volume
	// even when it is a regular file standing in for a device (tests).
	blockFile bool
}

// Exit statuses of the server's single job.
type state int

const (
	stateIdle state = iota
	stateBusy
	stateDone
)

// Server serves uploads until one succeeds.
type Server struct {
	cfg      Config
	log      logr.Logger
	progress *importer.Progress
	reg      *prometheus.Registry

	mu    sync.Mutex
	state state

	// done is closed with result set once an upload has succeeded.
	done chan struct{}
	// asyncFailed receives the error of an async upload that failed after
	// its client was answered.
	asyncFailed chan error
	outcome     outcome
	// bg is the server's lifetime context, for async uploads that outlive
	// their request.
	bg context.Context
}

// New validates cfg and builds a server.
func New(cfg Config, log logr.Logger) (*Server, error) {
	if cfg.CertFile == "" || cfg.KeyFile == "" {
		return nil, errors.New("a serving certificate and key are required")
	}
	if cfg.ClientCAFile == "" {
		return nil, errors.New("a client CA bundle is required: the upload server only accepts the upload proxy, or a clone's source pod")
	}
	if cfg.ClientName == "" {
		return nil, errors.New("the client certificate's common name (--client-name) is required: the upload proxy's, or a clone's <srcNs>/<srcName>-<tgtNs>/<tgtName>")
	}
	switch cfg.ContentType {
	case "":
		cfg.ContentType = string(datapath.ContentKubevirt)
	case string(datapath.ContentKubevirt), string(datapath.ContentArchive):
	default:
		return nil, fmt.Errorf("content type %q is not supported (use kubevirt or archive)", cfg.ContentType)
	}
	if _, err := datapath.ParseChecksum(cfg.Checksum); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	progress, err := importer.NewProgress(reg, cfg.OwnerUID)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, log: log, progress: progress, reg: reg, done: make(chan struct{}), asyncFailed: make(chan error, 1), bg: context.Background()}, nil
}

// TLSConfig builds the server's TLS settings: client certificates are
// verified against the client CA when given, and required by the upload
// handlers (probes of /healthz come without one).
func (s *Server) TLSConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(s.cfg.CertFile, s.cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("loading serving certificate: %w", err)
	}
	caPEM, err := os.ReadFile(s.cfg.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("reading client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("client CA %s holds no PEM certificate", s.cfg.ClientCAFile)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
	}, nil
}

// Handler returns the server's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, v := range []string{"v1beta1", "v1alpha1"} {
		mux.HandleFunc("/"+v+"/upload", s.route(mode{}))
		mux.HandleFunc("/"+v+"/upload-async", s.route(mode{async: true}))
		mux.HandleFunc("/"+v+"/upload-form", s.route(mode{form: true}))
		mux.HandleFunc("/"+v+"/upload-form-async", s.route(mode{form: true, async: true}))
		mux.HandleFunc("/"+v+"/upload-archive", s.route(mode{archive: true}))
		mux.HandleFunc("/"+v+"/upload-archive-async", s.route(mode{archive: true, async: true}))
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "ok")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc(contract.UploadOutcomePath, s.handleOutcome)
	return mux
}

// Run serves until an upload succeeds (then it writes the termination
// message and returns nil) or ctx ends.
func (s *Server) Run(ctx context.Context) error {
	tlsCfg, err := s.TLSConfig()
	if err != nil {
		return s.fail(err)
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return s.fail(fmt.Errorf("listening on %s: %w", s.cfg.Addr, err))
	}
	s.bg = ctx
	srv := &http.Server{
		Handler:           s.Handler(),
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          nil,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	s.log.Info("upload server listening", "addr", ln.Addr().String(), "contentType", s.cfg.ContentType)
	if s.cfg.OnListen != nil {
		s.cfg.OnListen(ln.Addr().String())
	}
	select {
	case <-s.done:
	case err := <-s.asyncFailed:
		// Exit with the reason (not permanent: a new upload server takes
		// the next try), so that the failure shows on the claim.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		err = fmt.Errorf("the upload was received but could not be written: %w", err)
		text := err.Error()
		_ = s.writeTermination(contract.TerminationMessage{Outcome: contract.OutcomeFailed, Message: &text})
		return err
	case err := <-errc:
		return s.fail(fmt.Errorf("serving: %w", err))
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return ctx.Err()
	}
	// Let the successful response reach the client before exiting.
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return s.writeTermination(s.successMessage())
}

// outcome is what the termination message of a success says.
type outcome struct {
	message      string
	preallocated bool
}

// MessageUploadComplete is the termination message text of a successful upload.
const MessageUploadComplete = "Upload Complete"

func (s *Server) fail(err error) error {
	text, permanent := err.Error(), true
	_ = s.writeTermination(contract.TerminationMessage{Outcome: contract.OutcomeFailed, Message: &text, Permanent: &permanent})
	return err
}

func (s *Server) writeTermination(m contract.TerminationMessage) error {
	if s.cfg.Paths.TerminationLog == "" {
		return nil
	}
	return contract.WriteTermination(s.cfg.Paths.TerminationLog, m)
}

// Done is closed once an upload has succeeded.
func (s *Server) Done() <-chan struct{} { return s.done }

type mode struct{ async, form, archive bool }

func (s *Server) route(m mode) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodHead && m.async:
			w.WriteHeader(http.StatusOK) // clients probe for async support
			return
		case r.Method != http.MethodPost && r.Method != http.MethodPut:
			w.Header().Set("Allow", "POST, PUT")
			refuse(w, r, "use POST to upload", http.StatusMethodNotAllowed)
			return
		}
		if msg := s.checkClient(r); msg != "" {
			refuse(w, r, msg, http.StatusUnauthorized)
			return
		}
		clone, msg, code := s.cloneRequest(r, m)
		if msg != "" {
			refuse(w, r, msg, code)
			return
		}
		s.mu.Lock()
		switch s.state {
		case stateDone:
			s.mu.Unlock()
			refuse(w, r, "the upload has already completed", http.StatusConflict)
			return
		case stateBusy:
			s.mu.Unlock()
			refuse(w, r, "another upload is in progress", http.StatusServiceUnavailable)
			return
		}
		s.state = stateBusy
		s.mu.Unlock()
		if clone != "" {
			s.handleClone(w, r, clone)
			return
		}
		s.handle(w, r, m)
	}
}

// checkClient explains why the request's client certificate is refused, or
// returns "" when it is accepted.
func (s *Server) checkClient(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
		if s.cloneTarget() {
			return "a client certificate from the clone client signer is required: this upload server receives only the clone " + strconv.Quote(s.cfg.ClientName)
		}
		return "a client certificate from the upload proxy's CA is required"
	}
	if cn := r.TLS.VerifiedChains[0][0].Subject.CommonName; cn != s.cfg.ClientName {
		if s.cloneTarget() {
			return fmt.Sprintf("client certificate %q is not this clone's: this upload server receives only the clone %q", cn, s.cfg.ClientName)
		}
		return fmt.Sprintf("client certificate %q is not the upload proxy's", cn)
	}
	return ""
}

// handle runs one upload; the state is busy on entry.
func (s *Server) handle(w http.ResponseWriter, r *http.Request, m mode) {
	// Progress is the share of the request body read, of its Content-Length
	// (a form's too: its framing is small), whatever the mode; it stays 0
	// when the length is unknown. The refusal's drain reads the body past
	// the wrapper, so that a failed upload's leftovers count for nothing.
	counted := &bodyProgress{r: r.Body, total: r.ContentLength, report: s.received}
	var body io.Reader = counted
	size := r.ContentLength
	if m.form {
		part, err := filePart(r, counted)
		if err != nil {
			counted.stop()
			s.finish(outcome{}, err)
			refuse(w, r, err.Error(), http.StatusBadRequest)
			return
		}
		body, size = part, -1
	}
	contentType := datapath.ContentType(s.cfg.ContentType)
	if m.archive {
		contentType = datapath.ContentArchive
	}
	opt, err := s.options(contentType)
	if err != nil {
		counted.stop()
		s.finish(outcome{}, err)
		refuse(w, r, err.Error(), http.StatusInternalServerError)
		return
	}
	received := make(chan struct{})
	src := &source.Stream{Name: "upload from " + r.RemoteAddr, Body: io.NopCloser(&eofNotifier{r: body, eof: received}), Len: size}
	s.log.Info("upload started", "path", r.URL.Path, "remote", r.RemoteAddr, "contentLength", size, "contentType", contentType,
		"destination", opt.Path, "block", opt.Block, "usableSize", opt.Size)
	start := time.Now()
	run := func(ctx context.Context) error {
		res, err := datapath.Import(ctx, src, opt)
		counted.stop()
		var out outcome
		if err == nil {
			out = outcome{MessageUploadComplete, res.PreallocationApplied}
		}
		s.finish(out, err)
		if err == nil {
			s.log.Info("upload complete", "format", res.Format, "wrappers", res.Wrappers, "method", res.Method,
				"virtualSize", res.VirtualSize, "bytesWritten", res.Written, "seconds", time.Since(start).Seconds())
		}
		return err
	}
	if !m.async {
		if err := run(r.Context()); err != nil {
			s.log.Error(err, "upload failed", "remote", r.RemoteAddr)
			refuseAfterRead(w, r, "upload failed: "+err.Error(), StatusFor(err))
			return
		}
		_, _ = io.WriteString(w, "upload complete\n")
		return
	}
	// Async: answer once the body is in; the conversion may go on.
	errc := make(chan error, 1)
	go func() { errc <- run(s.bg) }()
	select {
	case err := <-errc:
		if err != nil {
			s.log.Error(err, "upload failed", "remote", r.RemoteAddr)
			refuseAfterRead(w, r, "upload failed: "+err.Error(), StatusFor(err))
			return
		}
	case <-received:
		// Most bad images are refused as soon as their header is parsed: give
		// the processing a moment, so that the client still hears of those.
		select {
		case err := <-errc:
			if err != nil {
				s.log.Error(err, "upload failed", "remote", r.RemoteAddr)
				refuseAfterRead(w, r, "upload failed: "+err.Error(), StatusFor(err))
				return
			}
		case <-time.After(asyncGrace):
			go func() {
				if err := <-errc; err != nil {
					// The client was told the upload was received: the pod's
					// failure is now the only way to tell anyone.
					s.log.Error(err, "processing the received upload failed")
					s.asyncFailed <- err
				}
			}()
		}
	}
	_, _ = io.WriteString(w, "upload received\n")
}

// asyncGrace is how long an async upload waits, once its body is in, for
// the processing to fail early before answering 200.
var asyncGrace = 3 * time.Second

// finish records an upload's outcome: success ends the server's job, a
// failure makes it ready for another try, which starts from 0%.
func (s *Server) finish(out outcome, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.state = stateIdle
		s.progress.Reset()
		return
	}
	s.state = stateDone
	s.outcome = out
	s.progress.Set(100)
	close(s.done)
}

// maxBeforeDone is the most progress shown before an upload has succeeded:
// a body read to its end is not yet on disk (shown as "99.99%", never
// "100.00%").
const maxBeforeDone = 99.99

// received reports done of total body bytes read (nothing when the length
// is unknown), below 100% until finish.
func (s *Server) received(done, total int64) {
	if total <= 0 {
		return
	}
	s.progress.Set(min(100*float64(done)/float64(total), maxBeforeDone))
}

// options works out the destination as the importer does: the block
// device when it exists, else the image file (or, for archives, its
// directory), bounded by the usable size.
func (s *Server) options(ct datapath.ContentType) (datapath.Options, error) {
	opt, err := importer.DestinationOptions(s.cfg.Paths, ct, s.cfg.ImageSize, s.cfg.FilesystemOverhead)
	if err != nil {
		return opt, err
	}
	// Progress is counted on the request body (see handle), not here.
	opt.Preallocate, opt.Log = s.cfg.Preallocation, s.log
	opt.Checksum, _ = datapath.ParseChecksum(s.cfg.Checksum)
	return opt, nil
}

// filePart finds the multipart part named "file" in body, r's body,
// without reading the parts before it into memory.
func filePart(r *http.Request, body io.Reader) (*multipart.Part, error) {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || (mt != "multipart/form-data" && mt != "multipart/mixed") || params["boundary"] == "" {
		return nil, fmt.Errorf("a form upload needs a multipart/form-data body with a boundary (Content-Type %q)", r.Header.Get("Content-Type"))
	}
	mr := multipart.NewReader(body, params["boundary"])
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return nil, errors.New(`the form has no part named "file"`)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the form: %w", err)
		}
		if part.FormName() == "file" {
			return part, nil
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(part, 1<<20))
	}
}

// StatusFor maps an upload failure to its HTTP status: the client's data
// is at fault (4xx) or the server is (5xx).
func StatusFor(err error) int {
	switch {
	case errors.Is(err, datapath.ErrTooBig):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, datapath.ErrScratchRequired):
		return http.StatusInternalServerError
	case importer.Permanent(err):
		return http.StatusBadRequest
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF), errors.Is(err, context.Canceled),
		strings.Contains(err.Error(), "unexpected EOF"):
		return http.StatusBadRequest // the body ended early
	}
	return http.StatusInternalServerError
}

// refuse answers at once, before the rest of the body is read, and flushes,
// so a client still sending gets the reason rather than a reset connection.
// The connection is closed afterwards.
//
// The rest of the body, up to maxDrain bytes and drainTime, is then read
// and dropped: closing a connection with unread data makes the kernel send
// a reset, which can destroy the response before the client reads it. A
// client that sends Expect: 100-continue gets the refusal before sending
// any of its body at all.
func refuse(w http.ResponseWriter, r *http.Request, msg string, code int) {
	respond(w, r, msg, code, r.Header.Get("Expect") == "")
}

// refuseAfterRead is refuse once the body has been partly read (the client
// got its 100 Continue, if it asked for one).
func refuseAfterRead(w http.ResponseWriter, r *http.Request, msg string, code int) {
	respond(w, r, msg, code, true)
}

func respond(w http.ResponseWriter, r *http.Request, msg string, code int, drain bool) {
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex()
	w.Header().Set("Connection", "close")
	http.Error(w, msg, code)
	_ = rc.Flush()
	if !drain {
		return // the body was never asked for
	}
	_ = rc.SetReadDeadline(time.Now().Add(drainTime))
	_, _ = io.CopyN(io.Discard, r.Body, maxDrain)
}

// How much of a refused body is read so that the refusal arrives intact.
const (
	maxDrain  = 64 << 20
	drainTime = 10 * time.Second
)

// bodyProgress reports the bytes of an upload's body read so far, against
// its length, until it is stopped at the upload's end.
type bodyProgress struct {
	r       io.Reader
	total   int64
	report  func(done, total int64)
	n       atomic.Int64
	stopped atomic.Bool
}

func (b *bodyProgress) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	done := b.n.Add(int64(n))
	if n > 0 && !b.stopped.Load() {
		b.report(done, b.total)
	}
	if err == io.ErrUnexpectedEOF {
		// A body cut short (the connection died before Content-Length, or
		// mid-chunk): say how much of it arrived.
		if b.total >= 0 {
			err = fmt.Errorf("the upload ended after %d of its %d bytes: %w", done, b.total, err)
		} else {
			err = fmt.Errorf("the upload ended after %d bytes, before its end: %w", done, err)
		}
	}
	return n, err
}

func (b *bodyProgress) stop() { b.stopped.Store(true) }

// eofNotifier closes eof once the wrapped reader has returned io.EOF.
type eofNotifier struct {
	r    io.Reader
	eof  chan struct{}
	once sync.Once
}

func (e *eofNotifier) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if errors.Is(err, io.EOF) {
		e.once.Do(func() { close(e.eof) })
	}
	return n, err
}
