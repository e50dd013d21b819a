package uploadserver

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

// getOutcome asks the outcome endpoint without a client certificate, as
// the controller does, verifying the server's certificate.
func (r *running) getOutcome(t *testing.T, query string) (int, string) {
	t.Helper()
	resp, err := r.pki.client(nil).Get(r.url + contract.UploadOutcomePath + query)
	if err != nil {
		t.Fatalf("GET outcome: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// TestOutcome: the outcome endpoint says nothing (204) before an upload
// succeeded, nor after a failed one; a waiting request is answered as soon
// as one succeeds, with the termination message the pod then leaves.
func TestOutcome(t *testing.T) {
	r := start(t, nil)
	if code, body := r.getOutcome(t, ""); code != http.StatusNoContent {
		t.Fatalf("before any upload: %d %q, want 204", code, body)
	}
	for _, q := range []string{"?wait=soon", "?wait=-1s"} {
		if code, body := r.getOutcome(t, q); code != http.StatusBadRequest {
			t.Errorf("%s: %d %q, want 400", q, code, body)
		}
	}
	if resp, err := r.pki.client(nil).Post(r.url+contract.UploadOutcomePath, "text/plain", nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST outcome: %v %v, want 405", resp, err)
	}
	// A failed upload (too big for the volume) is not an outcome.
	dir := t.TempDir()
	if code, msg := r.postFile(t, "/v1beta1/upload", testimg.Raw(t, dir, 2*imgSize)); code/100 == 2 {
		t.Fatalf("a too big upload was accepted: %d %s", code, msg)
	}
	if err := os.Remove(filepath.Join(dir, "source.raw")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if code, body := r.getOutcome(t, "?wait=200ms"); code != http.StatusNoContent || time.Since(start) < 150*time.Millisecond {
		t.Fatalf("after a failed upload: %d %q after %s, want 204 after the 200ms wait", code, body, time.Since(start))
	}

	type answer struct {
		code int
		body string
		at   time.Time
	}
	waiting := make(chan answer, 1)
	go func() {
		resp, err := r.pki.client(nil).Get(r.url + contract.UploadOutcomePath + "?wait=30s")
		if err != nil {
			waiting <- answer{code: -1, body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		waiting <- answer{resp.StatusCode, strings.TrimSpace(string(b)), time.Now()}
	}()
	time.Sleep(100 * time.Millisecond) // the request waits
	raw := testimg.Raw(t, dir, imgSize)
	if code, msg := r.postFile(t, "/v1beta1/upload", raw); code != http.StatusOK {
		t.Fatalf("upload: %d %s", code, msg)
	}
	uploaded := time.Now()
	var got answer
	select {
	case got = <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting outcome request was not answered after the upload succeeded")
	}
	if got.code != http.StatusOK || got.at.After(uploaded.Add(5*time.Second)) {
		t.Fatalf("waiting outcome request: %d %q, want 200 at once", got.code, got.body)
	}
	var m contract.TerminationMessage
	if err := json.Unmarshal([]byte(got.body), &m); err != nil || m.Outcome != contract.OutcomeSucceeded || m.Message == nil || *m.Message != MessageUploadComplete {
		t.Fatalf("outcome %q (%v), want Succeeded with %q", got.body, err, MessageUploadComplete)
	}
	r.waitExit(t)
	term, err := os.ReadFile(r.termLog)
	if err != nil {
		t.Fatal(err)
	}
	if string(term) != got.body {
		t.Errorf("the outcome %s differs from the termination message %s", got.body, term)
	}
}
