package uploadserver

import (
	"bytes"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"
)

const progressSeries = `kubevirt_cdi_import_progress_total{ownerUID="uid-1"}`

// progressNow reads the progress metric as the controller does: /metrics
// over TLS without a client certificate.
func (r *running) progressNow(t *testing.T) float64 {
	t.Helper()
	resp, err := r.pki.client(nil).Get(r.url + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", resp.StatusCode, text)
	}
	v, ok := parseMetric(string(text), progressSeries)
	if !ok {
		t.Fatalf("no %s in /metrics:\n%s", progressSeries, text)
	}
	return v
}

// waitProgress polls the metric until it is within [lo, hi], failing if it
// ever shows more than hi: the server cannot have more than was sent.
func (r *running) waitProgress(t *testing.T, lo, hi float64) float64 {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		v := r.progressNow(t)
		if v > hi {
			t.Fatalf("progress %.4f%% exceeds the %.4f%% sent", v, hi)
		}
		if v >= lo {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("progress stuck at %.4f%%, want at least %.4f%%", v, lo)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// slowUpload is one upload whose body the test hands over piece by piece.
type slowUpload struct {
	pw   *io.PipeWriter
	body []byte
	sent int
	done chan result
}

type result struct {
	code int
	msg  string
}

func (r *running) startUpload(t *testing.T, path string, body []byte, contentLength int64, contentType string) *slowUpload {
	t.Helper()
	pr, pw := io.Pipe()
	u := &slowUpload{pw: pw, body: body, done: make(chan result, 1)}
	go func() {
		req, _ := http.NewRequest(http.MethodPost, r.url+path, pr)
		req.ContentLength = contentLength
		req.Header.Set("Content-Type", contentType)
		resp, err := r.proxy.Do(req)
		if err != nil {
			u.done <- result{0, err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		u.done <- result{resp.StatusCode, strings.TrimSpace(string(b))}
	}()
	return u
}

// sendTo hands the body over up to byte n.
func (u *slowUpload) sendTo(t *testing.T, n int) {
	t.Helper()
	if _, err := u.pw.Write(u.body[u.sent:n]); err != nil {
		t.Fatalf("sending bytes %d-%d: %v", u.sent, n, err)
	}
	u.sent = n
}

// finish sends the rest, if the server still reads it, and returns its answer.
func (u *slowUpload) finish(t *testing.T) result {
	t.Helper()
	if _, err := u.pw.Write(u.body[u.sent:]); err != nil {
		t.Logf("the server stopped reading after byte %d: %v", u.sent, err)
	}
	u.pw.Close()
	select {
	case res := <-u.done:
		return res
	case <-time.After(time.Minute):
		t.Fatal("no answer to the upload")
	}
	return result{}
}

func patternedImage(n int) []byte {
	b, _ := io.ReadAll(io.LimitReader(&patterned{}, int64(n)))
	return b
}

// TestProgressIsBodyReceived: the progress metric is the share of the
// request body received, of its Content-Length, for a plain and a form
// upload; it is 0 before an upload and while the length is unknown, and
// 100 once the upload has succeeded.
func TestProgressIsBodyReceived(t *testing.T) {
	img := patternedImage(imgSize)
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	_ = mw.WriteField("note", "a field before the file")
	fw, _ := mw.CreateFormFile("file", "disk.img")
	_, _ = fw.Write(img)
	_ = mw.Close()

	cases := []struct {
		name, path, contentType string
		body                    []byte
		length                  int64
		// at are the shares of the body sent before each look; want the
		// progress expected then (-1: the share sent, give or take the
		// form reader's look-ahead).
		at   []float64
		want []float64
	}{
		{"raw, known length", "/v1beta1/upload", "application/octet-stream", img, imgSize, []float64{0.25, 0.5, 0.875}, []float64{25, 50, 87.5}},
		{"form, known length", "/v1beta1/upload-form", mw.FormDataContentType(), form.Bytes(), int64(form.Len()), []float64{0.3, 0.6}, []float64{-1, -1}},
		{"raw, length unknown", "/v1beta1/upload", "application/octet-stream", img, -1, []float64{0.5}, []float64{0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := start(t, nil)
			if v := r.progressNow(t); v != 0 {
				t.Fatalf("progress %.2f%% before any upload, want 0", v)
			}
			u := r.startUpload(t, c.path, c.body, c.length, c.contentType)
			for i, share := range c.at {
				u.sendTo(t, int(share*float64(len(c.body))))
				sent := 100 * float64(u.sent) / float64(len(c.body))
				switch want := c.want[i]; {
				case want < 0:
					v := r.waitProgress(t, sent-1, sent)
					t.Logf("%.1f%% of the form sent: progress %.4f%%", sent, v)
				case want == 0:
					time.Sleep(500 * time.Millisecond) // the server has read what it can
					if v := r.progressNow(t); v != 0 {
						t.Errorf("progress %.4f%% with the length unknown, want 0", v)
					}
				default:
					r.waitProgress(t, want, want)
				}
			}
			if res := u.finish(t); res.code != http.StatusOK {
				t.Fatalf("upload: %d %s", res.code, res.msg)
			}
			r.waitExit(t)
			if v := r.srv.progress.Value(); v != 100 {
				t.Errorf("progress %.2f%% after success, want 100", v)
			}
		})
	}
}

// TestProgressRestartsAfterFailedUpload: an upload cut off halfway takes
// the progress back to 0, and so does one refused at once (too big for the
// volume), whose body the server reads only so that the refusal arrives:
// those bytes count for nothing. The next upload starts from 0.
func TestProgressRestartsAfterFailedUpload(t *testing.T) {
	r := start(t, nil)
	img := patternedImage(imgSize)
	u := r.startUpload(t, "/v1beta1/upload", img, imgSize, "application/octet-stream")
	u.sendTo(t, imgSize/2)
	r.waitProgress(t, 50, 50)
	u.pw.CloseWithError(errors.New("the client went away"))
	if res := <-u.done; res.code != 0 {
		t.Logf("the cut-off upload: %d %s", res.code, res.msg)
	}
	deadline := time.Now().Add(15 * time.Second)
	for v := r.progressNow(t); v != 0; v = r.progressNow(t) {
		if time.Now().After(deadline) {
			t.Fatalf("progress %.4f%% after the upload was cut off, want 0", v)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-r.errc:
		t.Fatalf("the server exited (%v): it took the cut-off upload for a complete one", err)
	default:
	}

	tooBig := patternedImage(imgSize * 3 / 2)
	u = r.startUpload(t, "/v1beta1/upload", tooBig, int64(len(tooBig)), "application/octet-stream")
	if res := u.finish(t); res.code != http.StatusRequestEntityTooLarge {
		t.Fatalf("an upload 1.5 times the volume: %d %s, want 413", res.code, res.msg)
	}
	if v := r.progressNow(t); v != 0 {
		t.Errorf("progress %.4f%% after a refused upload, want 0", v)
	}

	// The retry: the server may still be noticing the refused connection (503).
	for {
		u = r.startUpload(t, "/v1beta1/upload", img, imgSize, "application/octet-stream")
		u.sendTo(t, imgSize/4)
		select {
		case res := <-u.done:
			if res.code != http.StatusServiceUnavailable || time.Now().After(deadline) {
				t.Fatalf("the retry: %d %s", res.code, res.msg)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		case <-time.After(200 * time.Millisecond):
		}
		break
	}
	r.waitProgress(t, 25, 25)
	if res := u.finish(t); res.code != http.StatusOK {
		t.Fatalf("the retry: %d %s", res.code, res.msg)
	}
	r.waitExit(t)
	if v := r.srv.progress.Value(); v != 100 {
		t.Errorf("progress %.2f%% after success, want 100", v)
	}
}
