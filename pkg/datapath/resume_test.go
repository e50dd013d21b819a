package datapath

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/kubefill/kubefill/pkg/datapath/source"
)

// cuttingServer serves one object and cuts the TCP connection in the
// middle of the body at each offset of cuts, once each, recording every
// request's Range header.
type cuttingServer struct {
	*httptest.Server
	body   []byte
	mu     sync.Mutex
	cuts   []int64
	ranges []string
	// refuseAfterCuts answers 503 to every request once the cuts are used.
	refuseAfterCuts bool
}

func newCuttingServer(t *testing.T, body []byte, cuts ...int64) *cuttingServer {
	s := &cuttingServer{body: body, cuts: cuts}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *cuttingServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.ranges = append(s.ranges, r.Header.Get("Range"))
	var cut int64 = -1
	if len(s.cuts) > 0 {
		cut, s.cuts = s.cuts[0], s.cuts[1:]
	} else if s.refuseAfterCuts && len(s.ranges) > 1 {
		s.mu.Unlock()
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
		return
	}
	s.mu.Unlock()
	start := int64(0)
	w.Header().Set("Accept-Ranges", "bytes")
	w.Header().Set("ETag", `"v1"`)
	if rg := r.Header.Get("Range"); rg != "" {
		var err error
		first, _, _ := strings.Cut(strings.TrimPrefix(rg, "bytes="), "-")
		if start, err = strconv.ParseInt(first, 10, 64); err != nil || start >= int64(len(s.body)) {
			http.Error(w, "bad range", http.StatusRequestedRangeNotSatisfiable)
			return
		}
		if ir := r.Header.Get("If-Range"); ir != "" && ir != `"v1"` {
			start = 0
		} else {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, len(s.body)-1, len(s.body)))
		}
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(s.body)-int(start)))
	if start > 0 {
		w.WriteHeader(http.StatusPartialContent)
	}
	if cut < 0 || cut <= start {
		w.Write(s.body[start:])
		return
	}
	// Send up to the cut, make sure it left, then drop the connection.
	w.Write(s.body[start:cut])
	w.(http.Flusher).Flush()
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

func (s *cuttingServer) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ranges...)
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// The HTTP source drops the connection three times mid-transfer: each time
// the import resumes with a Range request from the byte it had, and the
// image written has the source's bytes.
func TestImportResumesAfterThreeDrops(t *testing.T) {
	body := make([]byte, 12<<20)
	rand.Read(body)
	cuts := []int64{3<<20 + 17, 6<<20 + 4093, 10 << 20}
	srv := newCuttingServer(t, body, cuts...)
	src, err := source.NewHTTP(source.HTTPConfig{URL: srv.URL + "/disk.img", Backoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, Retries: 3})
	if err != nil {
		t.Fatal(err)
	}
	out := outPath(t)
	res, err := Import(context.Background(), src, Options{Path: out, Size: 16 << 20, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	got := srv.requests()
	end := len(body) - 1
	want := []string{"", fmt.Sprintf("bytes=%d-%d", cuts[0], end), fmt.Sprintf("bytes=%d-%d", cuts[1], end), fmt.Sprintf("bytes=%d-%d", cuts[2], end)}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("requests' Range headers %q, want %q", got, want)
	}
	img, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if res.VirtualSize != int64(len(body)) || sha(img[:len(body)]) != sha(body) {
		t.Fatalf("image of %d bytes, sha256 %s; want %d bytes, %s", res.VirtualSize, sha(img[:len(body)]), len(body), sha(body))
	}
	t.Logf("resumed at %v; sha256 %s", want[1:], sha(body))
}

// A server that drops the download and then refuses every resume: the
// retries are bounded and the error says where the download broke, how
// often it was retried, and names the URL.
func TestResumeGivesUpWithAClearError(t *testing.T) {
	body := make([]byte, 4<<20)
	rand.Read(body)
	srv := newCuttingServer(t, body, 1<<20)
	srv.refuseAfterCuts = true
	url := srv.URL + "/disk.img"
	src, err := source.NewHTTP(source.HTTPConfig{URL: url, Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Retries: 3})
	if err != nil {
		t.Fatal(err)
	}
	out := outPath(t)
	_, err = Import(context.Background(), src, Options{Path: out, Size: 16 << 20, Log: testr.New(t)})
	if err == nil {
		t.Fatal("import succeeded")
	}
	for _, want := range []string{url, "resuming at byte 1048576", "giving up after 3 retries", "HTTP 503"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q lacks %q", err, want)
		}
	}
	if n := len(srv.requests()); n != 1+3 {
		t.Fatalf("%d requests, want the first and 3 attempts to resume", n)
	}
	if st, err := os.Stat(out); err == nil && st.Size() != 0 {
		t.Fatalf("a failed import left %d bytes in the target", st.Size())
	}
	var se *source.StatusError
	if errors.As(err, &se) {
		t.Fatalf("a transient 503 is reported as permanent: %v", err)
	}
}
