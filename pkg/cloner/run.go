package cloner

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubefill/kubefill/pkg/contract"
)

// Job is the work of one clone source pod.
type Job struct {
	Source Source
	// UploadURL is the target upload server's URL; an empty path means
	// UploadPath.
	UploadURL string
	// ServerName, if set, is the name the upload server's certificate is
	// verified against, when UploadURL dials its pod's address.
	ServerName string
	// AddressFile, if set, is a file that names the upload pod's own
	// address ("<ip>:<port>") once the controller knows it: each attempt
	// dials it instead of UploadURL's host when it does, so the stream
	// need not wait for the Service proxy to route to a new pod.
	AddressFile string
	// OwnerUID labels the progress metric (the target claim's UID).
	OwnerUID string
	// ServerCA verifies the upload server; ClientCert and ClientKey are
	// this clone's client certificate (its name binds the stream to the
	// clone). All PEM.
	ServerCA, ClientCert, ClientKey []byte

	// TerminationLog receives the JSON outcome; empty skips it.
	TerminationLog string
	// MetricsAddr is where progress is served over HTTPS; empty disables it.
	MetricsAddr string
	// OnMetrics, if set, is told the metrics address once it listens.
	OnMetrics func(addr string)
	// RetryWindow bounds the time spent retrying a server that cannot be
	// reached before any byte is sent: the source pod starts beside the
	// upload pod, which may still be starting (pulling its image, say);
	// DefaultRetryWindow if zero.
	RetryWindow time.Duration
	Log         logr.Logger
}

// JobFromEnv reads a job from CDI's cloner environment: VOLUME_MODE,
// MOUNT_POINT (the source; CDI's paths by mode if empty), UPLOAD_URL,
// OWNER_UID, PREALLOCATION, and SERVER_CA_CERT, CLIENT_CERT, CLIENT_KEY,
// which hold PEM (CDI's way) or name files holding it.
func JobFromEnv(getenv func(string) string) (Job, error) {
	var j Job
	mode, err := ParseMode(getenv(EnvVolumeMode))
	if err != nil {
		return j, err
	}
	j.Source.Mode = mode
	j.Source.Path = getenv(EnvMountPoint)
	if j.Source.Path == "" {
		j.Source.Path = SourceMountPoint
		if mode == Block {
			j.Source.Path = contract.BlockPath
		}
	}
	if v := getenv(EnvPreallocation); v != "" {
		if j.Source.Dense, err = strconv.ParseBool(v); err != nil {
			return j, fmt.Errorf("%s=%q is not a boolean", EnvPreallocation, v)
		}
	}
	j.UploadURL = getenv(EnvUploadURL)
	j.ServerName = getenv(EnvUploadServerName)
	j.AddressFile = getenv(EnvUploadAddressFile)
	j.OwnerUID = getenv(EnvOwnerUID)
	for _, p := range []struct {
		env string
		dst *[]byte
	}{{EnvServerCACert, &j.ServerCA}, {EnvClientCert, &j.ClientCert}, {EnvClientKey, &j.ClientKey}} {
		if *p.dst, err = pemValue(getenv(p.env)); err != nil {
			return j, fmt.Errorf("%s: %w", p.env, err)
		}
	}
	return j, nil
}

// pemValue is v itself if it is PEM, else the content of the file it names.
func pemValue(v string) ([]byte, error) {
	if v == "" || strings.Contains(v, "-----BEGIN") {
		return []byte(v), nil
	}
	return os.ReadFile(v)
}

func (j Job) validate() error {
	var missing []string
	if j.UploadURL == "" {
		missing = append(missing, EnvUploadURL)
	}
	if len(j.ServerCA) == 0 {
		missing = append(missing, EnvServerCACert)
	}
	if len(j.ClientCert) == 0 {
		missing = append(missing, EnvClientCert)
	}
	if len(j.ClientKey) == 0 {
		missing = append(missing, EnvClientKey)
	}
	if len(missing) > 0 {
		return fmt.Errorf("the clone job lacks %s", strings.Join(missing, ", "))
	}
	return nil
}

// HTTPError is a non-2xx answer of the upload server.
type HTTPError struct {
	Status int
	Body   string
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("the upload server answered %d %s: %s", e.Status, http.StatusText(e.Status), e.Body)
}

// permanent: a 4xx that retrying cannot fix (not 401, which a renewed
// certificate fixes, nor 408/429).
func permanent(err error) bool {
	var he *HTTPError
	if errors.As(err, &he) {
		switch he.Status {
		case http.StatusUnauthorized, http.StatusRequestTimeout, http.StatusTooManyRequests:
			return false
		}
		return he.Status >= 400 && he.Status < 500
	}
	return false
}

// Run streams the source to the upload server and writes the termination
// message: Succeeded ("Clone Complete") only once the server answered 2xx.
func Run(ctx context.Context, job Job) (err error) {
	log := job.Log
	defer func() {
		if job.TerminationLog == "" {
			return
		}
		m := contract.TerminationMessage{Outcome: contract.OutcomeSucceeded}
		text := MessageCloneComplete
		if job.Source.Dense { // as CDI's cloner reports a preallocated clone
			text += ", " + contract.MessagePreallocationApplied
			applied := true
			m.PreallocationApplied = &applied
		}
		if err != nil {
			m.PreallocationApplied = nil
			m.Outcome, text = contract.OutcomeFailed, err.Error()
			if permanent(err) {
				p := true
				m.Permanent = &p
			}
		}
		m.Message = &text
		if werr := contract.WriteTermination(job.TerminationLog, m); werr != nil && err == nil {
			err = werr
		}
	}()
	if err := job.validate(); err != nil {
		return err
	}
	client, target, err := uploadClient(job)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	progress, err := NewProgress(reg, job.OwnerUID)
	if err != nil {
		return err
	}
	if job.MetricsAddr != "" {
		ms, err := StartMetrics(job.MetricsAddr, reg)
		if err != nil {
			return fmt.Errorf("serving metrics: %w", err)
		}
		defer ms.Close()
		if job.OnMetrics != nil {
			job.OnMetrics(ms.Addr())
		}
	}
	log.Info("cloning", "source", job.Source.Path, "mode", job.Source.Mode, "contentType", job.Source.ContentType(), "url", target)
	start := time.Now()
	st, err := upload(ctx, client, target, job, progress.Update)
	if err != nil {
		return err
	}
	progress.Done()
	if len(st.Skipped) > 0 {
		log.Info("special files were left out of the clone", "count", len(st.Skipped), "first", st.Skipped[0])
	}
	log.Info("clone complete", "read", st.Read, "total", st.Total, "files", st.Files, "sparseFiles", st.SparseFiles, "took", time.Since(start).String())
	return nil
}

// uploadClient is an HTTP/1.1-only client presenting the clone's
// certificate and trusting only the upload server CA.
func uploadClient(job Job) (*http.Client, string, error) {
	u, err := url.Parse(job.UploadURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, "", fmt.Errorf("%s %q is not an https URL", EnvUploadURL, job.UploadURL)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = UploadPath
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(job.ServerCA) {
		return nil, "", fmt.Errorf("%s holds no PEM certificate", EnvServerCACert)
	}
	cert, err := tls.X509KeyPair(job.ClientCert, job.ClientKey)
	if err != nil {
		return nil, "", fmt.Errorf("loading the client certificate: %w", err)
	}
	tr := &http.Transport{
		Proxy:               nil, // a Service in the cluster: never through a proxy
		DialContext:         dialWithAttemptTimeout,
		TLSHandshakeTimeout: 30 * time.Second,
		TLSClientConfig: &tls.Config{
			MinVersion:   tls.VersionTLS12,
			RootCAs:      pool,
			ServerName:   job.ServerName,
			Certificates: []tls.Certificate{cert},
			NextProtos:   []string{"http/1.1"},
		},
		ForceAttemptHTTP2: false,
		TLSNextProto:      map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1 only
		WriteBufferSize:   256 << 10,
		DisableKeepAlives: true,
	}
	return &http.Client{Transport: tr}, u.String(), nil
}

// upload POSTs the stream, produced as the transport reads it (nothing is
// buffered). A failure of the source aborts the request, so the server
// sees a cut body, never a clean end. Attempts that fail before the first
// byte is read (the server is not listening yet) are retried, quickly at
// first (see retryWait), for job.RetryWindow.
func upload(ctx context.Context, client *http.Client, target string, job Job, progress func(done, total int64)) (Stats, error) {
	window := job.RetryWindow
	if window <= 0 {
		window = DefaultRetryWindow
	}
	start, lastLog := time.Now(), time.Time{}
	directFailed, lastDirect := false, ""
	timedOut := 0
	for i := 1; ; i++ {
		dst, timeout := target, dialTimeout(timedOut+1)
		// The upload pod's own address when known, except right after it
		// failed (it may be a replaced pod's): then the Service's.
		direct := ""
		if !directFailed {
			direct = directTarget(target, job.AddressFile)
		}
		if direct != "" {
			dst, timeout = direct, min(timeout, time.Second)
			if direct != lastDirect {
				lastDirect = direct
				job.Log.Info("dialing the upload pod's own address", "url", direct)
			}
		}
		attempt := context.WithValue(ctx, dialTimeoutKey{}, timeout)
		if i > 1 {
			// Say what reaching the server cost, once it answers: a slow
			// start shows whether the Service, the pod address or the
			// network kept the stream waiting.
			attempt = httptrace.WithClientTrace(attempt, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) {
				job.Log.Info("reached the upload server", "url", dst, "attempts", i, "after", time.Since(start).Round(time.Millisecond).String(), "timedOut", timedOut, "refused", i-1-timedOut)
			}})
		}
		st, started, err := uploadOnce(attempt, client, dst, job.Source, progress)
		wait := retryWait(i)
		if err == nil || started || !dialError(err) || time.Since(start)+wait > window || ctx.Err() != nil {
			return st, err
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			timedOut++
		}
		if directFailed = direct != ""; directFailed {
			wait = 0 // the Service's address at once
		}
		if time.Since(lastLog) >= 10*time.Second {
			lastLog = time.Now()
			job.Log.Info("the upload server is not reachable yet; retrying", "error", err.Error(), "attempt", i, "every", wait.String())
		}
		select {
		case <-ctx.Done():
			return st, context.Cause(ctx)
		case <-time.After(wait):
		}
	}
}

// directTarget is target with the host the address file names
// ("<ip>:<port>"), or "" when there is no file, it is empty or it does not
// hold an address.
func directTarget(target, file string) string {
	if file == "" {
		return ""
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	addr := strings.TrimSpace(string(b))
	host, port, err := net.SplitHostPort(addr)
	if err != nil || net.ParseIP(host) == nil || port == "" {
		return ""
	}
	u, err := url.Parse(target)
	if err != nil {
		return ""
	}
	u.Host = addr
	return u.String()
}

// dialTimeoutKey carries an attempt's dial timeout to the transport's dialer.
type dialTimeoutKey struct{}

// dialWithAttemptTimeout dials with the timeout of the attempt (see
// dialTimeout), 30 s when none is set.
func dialWithAttemptTimeout(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if t, ok := ctx.Value(dialTimeoutKey{}).(time.Duration); ok {
		d.Timeout = t
	}
	return d.DialContext(ctx, network, addr)
}

// dialTimeout is the dial timeout of an attempt after n-1 attempts timed
// out: 250 ms for the first quickAttempts, then 1 s, growing by a second
// each time up to 30 s. Refused attempts (nothing listens yet, or the
// Service has no endpoint) cost next to nothing and do not count. A
// Service address the node has no rule for yet (the Service was made
// moments ago) may leave the connection attempt unanswered rather than
// refused, and TCP would send its SYN again only a second later: on the
// local cluster one such attempt held a clone's start for 1.06 s. A short
// timeout tries again at once on a new connection; inside a cluster a
// connection is answered in milliseconds, and later attempts leave a slow
// network time to answer.
func dialTimeout(n int) time.Duration {
	if n <= quickAttempts {
		return 250 * time.Millisecond
	}
	return min(time.Duration(n-quickAttempts)*time.Second, 30*time.Second)
}

// quickAttempts is how many timed-out attempts get the short dial timeout.
const quickAttempts = 8

// DefaultRetryWindow is how long an upload server that cannot be reached
// is retried: long enough for its pod to start, image pull included.
const DefaultRetryWindow = 5 * time.Minute

// retryWait is the wait after the n-th failed attempt to reach the server:
// 50 ms for the first 40 attempts (2 s: the server usually listens within
// a second or two of the source pod's start, and the Service routes to it
// a moment later; a refused dial costs next to nothing), then growing by
// half each time up to 2 s.
func retryWait(n int) time.Duration {
	d := 50 * time.Millisecond
	for i := 40; i < n && d < 2*time.Second; i++ {
		d += d / 2
	}
	return min(d, 2*time.Second)
}

// dialError: the server could not be reached at all (not listening yet,
// its name not resolving yet). TLS refusals and answers are not retried.
func dialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// streamChunk is the size of the HTTP chunks the stream is sent in: the
// transport flushes every chunk to the connection, so large chunks mean
// few flushes and few TLS writes.
const streamChunk = 1 << 20

// streamBody produces the clone stream while the transport sends it:
// written straight into the request's chunked writer when the transport
// copies the body with WriteTo (net/http's does), else through a pipe as
// it is read. Either way the producer starts with the first byte asked for.
type streamBody struct {
	ctx      context.Context
	src      Source
	progress func(done, total int64)

	once    sync.Once
	started atomic.Bool
	done    chan streamResult // one result, once started
	pr      *io.PipeReader
	pw      *io.PipeWriter
}

type streamResult struct {
	st Stats
	// err is the producer's error; sinkErr, when set, says the request
	// side failed first (the connection, or the request ended early), so
	// err is not the source's fault.
	err, sinkErr error
}

// sinkWriter records the first error of the request side.
type sinkWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (s *sinkWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	s.n += int64(n)
	if err != nil && s.err == nil {
		s.err = err
	}
	return n, err
}

func newStreamBody(ctx context.Context, src Source, progress func(done, total int64)) *streamBody {
	b := &streamBody{ctx: ctx, src: src, progress: progress, done: make(chan streamResult, 1)}
	b.pr, b.pw = io.Pipe()
	return b
}

// produce writes the whole stream to w, in streamChunk chunks.
func (b *streamBody) produce(w io.Writer) streamResult {
	sink := &sinkWriter{w: w}
	bw := bufio.NewWriterSize(sink, streamChunk)
	st, err := WriteStream(b.ctx, bw, b.src, b.progress)
	if err == nil {
		err = bw.Flush()
	}
	return streamResult{st: st, err: err, sinkErr: sink.err}
}

// WriteTo implements io.WriterTo: the transport's body copy.
func (b *streamBody) WriteTo(w io.Writer) (int64, error) {
	ran := false
	var res streamResult
	var n int64
	b.once.Do(func() {
		ran = true
		b.started.Store(true)
		sink := &sinkWriter{w: w}
		res = b.produce(sink)
		n = sink.n
		b.done <- res
	})
	if !ran {
		// Read came first: go on reading the pipe.
		return io.Copy(w, onlyReader{b.pr})
	}
	return n, res.err
}

// onlyReader hides WriteTo, so io.Copy reads.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func (b *streamBody) Read(p []byte) (int, error) {
	b.once.Do(func() {
		b.started.Store(true)
		go func() {
			res := b.produce(b.pw)
			b.pw.CloseWithError(res.err) // nil: a clean end of the body
			b.done <- res
		}()
	})
	return b.pr.Read(p)
}

func (b *streamBody) Close() error { return b.pr.Close() }

var errAborted = errors.New("the upload request ended before the stream")

func uploadOnce(ctx context.Context, client *http.Client, target string, src Source, progress func(done, total int64)) (Stats, bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	body := newStreamBody(ctx, src, progress)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, body)
	if err != nil {
		return Stats{}, false, err
	}
	req.ContentLength = -1 // chunked: the size is not known in advance
	req.Header.Set(HeaderContentType, src.ContentType())
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := client.Do(req)
	var respErr error
	if err != nil {
		respErr = fmt.Errorf("posting the clone stream to %s: %w", target, err)
	} else {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			respErr = &HTTPError{Status: resp.StatusCode, Body: strings.TrimSpace(string(msg))}
		}
	}
	// The request is over: stop the producer if it still runs.
	b := body
	b.pr.CloseWithError(errAborted)
	if respErr != nil {
		cancel()
	}
	// Once Do has returned, the transport has either started the body or
	// will never: claim it, so a late start cannot race this decision.
	b.once.Do(func() {})
	if !b.started.Load() {
		return Stats{}, false, respErr
	}
	res := <-b.done
	switch {
	case res.err != nil && res.sinkErr == nil && !errors.Is(res.err, errAborted) && !errors.Is(res.err, io.ErrClosedPipe) && !errors.Is(res.err, context.Canceled):
		return res.st, true, fmt.Errorf("reading the clone source: %w", res.err)
	case respErr != nil:
		return res.st, true, respErr
	case res.err != nil:
		return res.st, true, fmt.Errorf("the clone stream did not complete: %w", res.err)
	}
	return res.st, true, nil
}
