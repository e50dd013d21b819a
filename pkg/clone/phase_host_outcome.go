package clone

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kubefill/kubefill/pkg/contract"
)

// uploadOutcomes learns that a host-assisted clone's upload server has
// succeeded from the server itself. The kubelet reports a pod's exit only
// once its relist notices it (every second) and its status update follows,
// so waiting for the upload pod to be Succeeded costs a clone up to a
// second or more after the data is durable. While an upload pod runs, one
// long-polled HTTPS request asks its server for its outcome
// (contract.UploadOutcomePath, answered once the data is fsynced), the
// server's certificate verified against the upload server CA and its
// Service's name, as the source pod verifies it: only that pod holds the
// key. A Succeeded answer is kept for that pod (by UID) and brings its
// target back at once. Anything else (no answer, a refused or unverifiable
// connection, a controller restarted meanwhile) leaves the decision to the
// pod's termination message, as before; failures always go that way.
type uploadOutcomes struct {
	mu sync.Mutex
	// ctx and queue are the controller's, once its sources started (start);
	// until then nothing is watched.
	ctx     context.Context
	queue   workqueue.TypedRateLimitingInterface[reconcile.Request]
	watches map[types.UID]*outcomeWatch // by upload pod UID
	// ask is one long-polled request: the outcome, nil while there is none.
	ask func(ctx context.Context, w *outcomeWatch) (*contract.TerminationMessage, error)
	// retry is the wait after the n-th failed request in a row; give up
	// stops a watch after that many.
	retry  func(n int) time.Duration
	giveUp int
	// port is the upload server's in its pod.
	port int
}

// outcomeWatch is the watch of one upload pod's server.
type outcomeWatch struct {
	target    types.NamespacedName
	targetUID types.UID
	url       string
	client    *http.Client
	cancel    context.CancelFunc
	succeeded *contract.TerminationMessage
}

func newUploadOutcomes() *uploadOutcomes {
	return &uploadOutcomes{watches: map[types.UID]*outcomeWatch{}, ask: askOutcome, retry: outcomeRetry, giveUp: 600, port: contract.UploadServerPort}
}

// start is the controller's source (source.Func): from now on upload pods
// are watched, each watch ending with ctx.
func (o *uploadOutcomes) start(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ctx, o.queue = ctx, q
	return nil
}

// succeeded is the outcome the server of upload pod uid reported, nil if
// it reported none.
func (o *uploadOutcomes) succeeded(uid types.UID) *contract.TerminationMessage {
	o.mu.Lock()
	defer o.mu.Unlock()
	if w := o.watches[uid]; w != nil {
		return w.succeeded
	}
	return nil
}

// started reports whether the controller's sources started (see start).
func (o *uploadOutcomes) started() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ctx != nil
}

// watching reports whether upload pod uid is watched.
func (o *uploadOutcomes) watching(uid types.UID) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.watches[uid] != nil
}

// watch starts asking the server of the running upload pod of target, once
// per pod; the watches of the target's earlier upload pods end. serverCA is
// the upload server CA bundle (PEM), serverName the Service's name on the
// pod's certificate. It does nothing before start or while the pod has no
// address.
func (o *uploadOutcomes) watch(target *corev1.PersistentVolumeClaim, pod *corev1.Pod, serverName string, serverCA []byte) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ctx == nil || pod.Status.PodIP == "" || o.watches[pod.UID] != nil {
		return nil
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(serverCA) {
		return fmt.Errorf("the upload server CA bundle holds no PEM certificate")
	}
	for uid, w := range o.watches {
		if w.targetUID == target.UID {
			w.cancel()
			delete(o.watches, uid)
		}
	}
	ctx, cancel := context.WithCancel(o.ctx)
	w := &outcomeWatch{
		target:    types.NamespacedName{Namespace: target.Namespace, Name: target.Name},
		targetUID: target.UID,
		url:       "https://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(o.port)) + contract.UploadOutcomePath,
		cancel:    cancel,
		client: &http.Client{Transport: &http.Transport{
			Proxy:               nil, // a pod's address: never through a proxy
			TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: serverName},
			TLSHandshakeTimeout: 10 * time.Second,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1,
			IdleConnTimeout:     outcomeWait + 30*time.Second,
		}},
	}
	o.watches[pod.UID] = w
	go o.run(ctx, w)
	return nil
}

// forget ends the watches of a target and drops what they learnt.
func (o *uploadOutcomes) forget(targetUID types.UID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for uid, w := range o.watches {
		if w.targetUID == targetUID {
			w.cancel()
			delete(o.watches, uid)
		}
	}
}

// run asks until the server reports its outcome, the watch ends, or the
// server stays unreachable (the pod is gone: then its termination message
// decides, or its replacement is watched).
func (o *uploadOutcomes) run(ctx context.Context, w *outcomeWatch) {
	defer w.client.CloseIdleConnections()
	for failures := 0; ctx.Err() == nil; {
		asked := time.Now()
		m, err := o.ask(ctx, w)
		switch {
		case err == nil && m != nil:
			o.mu.Lock()
			w.succeeded = m
			q := o.queue
			o.mu.Unlock()
			q.Add(reconcile.Request{NamespacedName: w.target})
			return
		case errors.Is(err, errNoOutcome):
			return // a server without the endpoint: the pod's exit decides
		case err == nil && time.Since(asked) >= time.Second:
			failures = 0 // no outcome yet: ask again
			continue
		}
		// A failure, or an answer that did not wait: not at once again.
		if failures++; failures >= o.giveUp {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(o.retry(failures)):
		}
	}
}

// outcomeWait is how long one request waits at the server for the outcome.
const outcomeWait = 30 * time.Second

// outcomeRetry is the wait after the n-th failed request in a row: 50 ms
// at first (a pod reported running may not listen for some milliseconds
// more), growing to 2 s.
func outcomeRetry(n int) time.Duration {
	return min(time.Duration(n)*50*time.Millisecond, 2*time.Second)
}

// askOutcome is one long-polled request for the server's outcome.
func askOutcome(ctx context.Context, w *outcomeWatch) (*contract.TerminationMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, outcomeWait+15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.url+"?wait="+outcomeWait.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusNoContent:
		return nil, nil
	case http.StatusOK:
		m, ok := contract.DecodeTermination(string(body))
		if !ok || m.Outcome != contract.OutcomeSucceeded {
			return nil, fmt.Errorf("the upload server's outcome %q is not a success", body)
		}
		return &m, nil
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return nil, fmt.Errorf("%w: %s", errNoOutcome, resp.Status)
	}
	return nil, fmt.Errorf("asking the upload server's outcome: %s", resp.Status)
}

// errNoOutcome: the upload server has no outcome endpoint.
var errNoOutcome = errors.New("the upload server does not report its outcome")
