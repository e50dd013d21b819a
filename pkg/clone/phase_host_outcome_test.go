package clone

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/pki"
	"github.com/kubefill/kubefill/pkg/populators"
)

const outcomeServerName = "cdi-upload-tmp-pvc-1.src.svc"

// outcomeServer is an upload server's outcome endpoint on loopback, serving
// a certificate from ca for name; answers are its replies in turn, the
// last one repeated.
func outcomeServer(t *testing.T, ca *pki.CA, name string, answers ...func(w http.ResponseWriter)) (port int, asked *atomic.Int32) {
	t.Helper()
	crt, key, err := ca.Issue(name, []string{name}, false, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	asked = &atomic.Int32{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != contract.UploadOutcomePath || r.URL.Query().Get("wait") == "" {
			http.Error(w, "unexpected request "+r.URL.String(), http.StatusNotFound)
			return
		}
		n := int(asked.Add(1)) - 1
		answers[min(n, len(answers)-1)](w)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the point
	srv.StartTLS()
	t.Cleanup(srv.Close)
	_, p, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ = strconv.Atoi(p)
	return port, asked
}

func succeededBody(w http.ResponseWriter) {
	text := contract.MessageCloneComplete
	b, _ := contract.TerminationMessage{Outcome: contract.OutcomeSucceeded, Message: &text}.Encode()
	_, _ = w.Write(b)
}

func noOutcomeYet(w http.ResponseWriter) { w.WriteHeader(http.StatusNoContent) }

func outcomeTarget() (*corev1.PersistentVolumeClaim, *corev1.Pod) {
	target := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "dst", Name: "copy", UID: "target-1"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "src", Name: "cdi-upload-tmp-pvc-1", UID: "pod-1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}}
	return target, pod
}

func startedOutcomes(t *testing.T, port int) (*uploadOutcomes, workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	t.Helper()
	o := newUploadOutcomes()
	o.port, o.retry, o.giveUp = port, func(int) time.Duration { return 10 * time.Millisecond }, 5
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	t.Cleanup(q.ShutDown)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := o.start(ctx, q); err != nil {
		t.Fatal(err)
	}
	return o, q
}

// A server that reports success brings its target back, and its outcome is
// kept for that pod only.
func TestUploadOutcomeSucceeded(t *testing.T) {
	ca, err := pki.NewCA("upload-server-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	port, asked := outcomeServer(t, ca, outcomeServerName, noOutcomeYet, succeededBody)
	o, q := startedOutcomes(t, port)
	target, pod := outcomeTarget()
	if err := o.watch(target, pod, outcomeServerName, ca.CertPEM); err != nil {
		t.Fatal(err)
	}
	if err := o.watch(target, pod, outcomeServerName, ca.CertPEM); err != nil { // once per pod
		t.Fatal(err)
	}
	got := make(chan reconcile.Request, 1)
	go func() {
		r, _ := q.Get()
		got <- r
	}()
	select {
	case r := <-got:
		if want := (types.NamespacedName{Namespace: "dst", Name: "copy"}); r.NamespacedName != want {
			t.Fatalf("enqueued %v, want %v", r, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the target was not enqueued after the server reported success")
	}
	m := o.succeeded(pod.UID)
	if m == nil || m.Outcome != contract.OutcomeSucceeded || m.Message == nil || *m.Message != contract.MessageCloneComplete {
		t.Fatalf("outcome %+v, want Succeeded %q", m, contract.MessageCloneComplete)
	}
	if n := asked.Load(); n != 2 {
		t.Errorf("the server was asked %d times, want 2 (no outcome, then success)", n)
	}
	if o.succeeded("another-pod") != nil {
		t.Error("another pod of the target has an outcome")
	}
	o.forget(target.UID)
	if o.succeeded(pod.UID) != nil || o.watching(pod.UID) {
		t.Error("a forgotten target's outcome is still kept")
	}
}

// What is not trustworthy is never a success: a certificate of another CA
// or for another Service, a Failed outcome, a server without the endpoint.
func TestUploadOutcomeRefused(t *testing.T) {
	ca, err := pki.NewCA("upload-server-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("someone-else", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	failed := func(w http.ResponseWriter) {
		text := "it failed"
		b, _ := contract.TerminationMessage{Outcome: contract.OutcomeFailed, Message: &text}.Encode()
		_, _ = w.Write(b)
	}
	for _, tc := range []struct {
		name   string
		ca     *pki.CA
		server string
		answer func(http.ResponseWriter)
	}{
		{"another CA", other, outcomeServerName, succeededBody},
		{"another Service's certificate", ca, "cdi-upload-tmp-pvc-2.src.svc", succeededBody},
		{"a failure", ca, outcomeServerName, failed},
		{"no endpoint", ca, outcomeServerName, func(w http.ResponseWriter) { http.NotFound(w, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port, _ := outcomeServer(t, tc.ca, tc.server, tc.answer)
			o, q := startedOutcomes(t, port)
			target, pod := outcomeTarget()
			if err := o.watch(target, pod, outcomeServerName, ca.CertPEM); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // five failures at 10 ms end the watch
			if o.succeeded(pod.UID) != nil {
				t.Fatal("an untrusted answer was taken as a success")
			}
			if q.Len() != 0 {
				t.Error("the target was enqueued")
			}
		})
	}
}

// Before the controller's sources start, or for a pod without an address,
// nothing is watched.
func TestUploadOutcomeNotStarted(t *testing.T) {
	ca, err := pki.NewCA("upload-server-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	o := newUploadOutcomes()
	target, pod := outcomeTarget()
	if err := o.watch(target, pod, outcomeServerName, ca.CertPEM); err != nil || o.watching(pod.UID) {
		t.Fatalf("watching before start: %v", err)
	}
	o, _ = startedOutcomes(t, 1)
	pod.Status.PodIP = ""
	if err := o.watch(target, pod, outcomeServerName, ca.CertPEM); err != nil || o.watching(pod.UID) {
		t.Fatalf("watching a pod without an address: %v", err)
	}
	pod.Status.PodIP = "127.0.0.1"
	if err := o.watch(target, pod, outcomeServerName, []byte("not PEM")); err == nil {
		t.Error("a CA bundle without PEM was accepted")
	}
}

// The host-assisted phase takes a running upload pod whose server reported
// success as done, and tells the running source pod the upload pod's
// address.
func TestHostCloneEarlyOutcomeAndAddress(t *testing.T) {
	ctx := context.Background()
	target, upload := outcomeTarget()
	prime := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "src", Name: "tmp-pvc-1"}}
	upload.Name = "cdi-upload-tmp-pvc-1"
	source := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "src", Name: SourcePodName(target.UID)}}
	c := fake.NewClientBuilder().WithObjects(upload, source).Build()
	p := &hostClonePhase{run: &run{k: &Kind{Client: c}}}
	f := &populators.Flow{Target: target, Prime: prime}
	running := populators.Result{Pod: &populators.PodStatus{Phase: corev1.PodRunning, Restarts: 1}}

	got, err := p.uploadPod(ctx, f, running)
	if err != nil || got == nil || got.UID != upload.UID {
		t.Fatalf("uploadPod: %v %v", got, err)
	}
	if err := p.tellSourceAddress(ctx, f, got); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(source), source); err != nil || source.Annotations[annUploadAddress] != "127.0.0.1:8443" {
		t.Fatalf("source pod annotations %v (%v), want %s=127.0.0.1:8443", source.Annotations, err, annUploadAddress)
	}

	outcomes := p.run.k.uploadOutcomesOf()
	if done, err := p.uploadSucceeded(ctx, f, running, got); err != nil || done != nil {
		t.Fatalf("before any outcome: %+v %v, want nothing", done, err)
	}
	text := contract.MessageCloneComplete
	outcomes.watches[upload.UID] = &outcomeWatch{targetUID: target.UID, cancel: func() {},
		succeeded: &contract.TerminationMessage{Outcome: contract.OutcomeSucceeded, Message: &text}}
	done, err := p.uploadSucceeded(ctx, f, running, got)
	if err != nil || done == nil || !done.Done || done.Pod.Phase != corev1.PodSucceeded || done.Pod.Restarts != 1 || done.Message != text {
		t.Fatalf("after the server reported success: %+v %v, want done, Succeeded, %q", done, err, text)
	}
	// Another pod of the same name (a replacement) has no outcome.
	other := got.DeepCopy()
	other.UID = "pod-2"
	if done, _ := p.uploadSucceeded(ctx, f, running, other); done != nil {
		t.Fatalf("a replaced upload pod took its predecessor's outcome: %+v", done)
	}
}
