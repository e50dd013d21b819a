package uploadproxy

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kubefill/kubefill/pkg/token"
)

// zeros is an endless reader that allocates nothing.
type zeros struct{}

func (zeros) Read(b []byte) (int, error) { clear(b); return len(b), nil }

// timeUpload POSTs size bytes to url and returns how long the answer took.
func timeUpload(t *testing.T, c *http.Client, url, auth string, size int64) time.Duration {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, io.LimitReader(zeros{}, size))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf("received %d bytes", size); resp.StatusCode != 200 || string(b) != want {
		t.Fatalf("got %d %q, want %q", resp.StatusCode, b, want)
	}
	return time.Since(start)
}

// TestThroughputRatio is the upload benchmark: the same bytes sent straight
// to the upload server over loopback TLS, then through the proxy, in the same
// run. It runs only with KUBEFILL_BENCH_UPLOAD=1 (size in MiB in
// KUBEFILL_BENCH_UPLOAD_MIB, 1024 by default); the best of three runs counts.
func TestThroughputRatio(t *testing.T) {
	if os.Getenv("KUBEFILL_BENCH_UPLOAD") == "" {
		t.Skip("set KUBEFILL_BENCH_UPLOAD=1 to run the upload throughput benchmark")
	}
	mib := int64(1024)
	if v := os.Getenv("KUBEFILL_BENCH_UPLOAD_MIB"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			t.Fatalf("KUBEFILL_BENCH_UPLOAD_MIB=%q", v)
		}
		mib = n
	}
	size := mib << 20
	r := newRig(t)
	// The direct client presents the proxy's client certificate itself.
	direct := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: r.serverCA.pool(), ServerName: ServiceHost(testNS, testPrime),
		Certificates: []tls.Certificate{r.clientCA.tlsCert(t, "direct", nil, true)},
	}}}
	auth := "Bearer " + r.token(t, token.NewUploadPayload(testNS, testPVC))
	best := func(f func() time.Duration) time.Duration {
		var b time.Duration
		for i := 0; i < 3; i++ {
			if d := f(); b == 0 || d < b {
				b = d
			}
		}
		return b
	}
	plain := best(func() time.Duration { return timeUpload(t, direct, r.upstream.URL+PathUpload, "", size) })
	proxied := best(func() time.Duration { return timeUpload(t, r.proxy.Client(), r.proxy.URL+PathUpload, auth, size) })
	rate := func(d time.Duration) float64 { return float64(mib) / d.Seconds() }
	fmt.Printf("upload benchmark, %d MiB, best of 3:\n  plain loopback TLS copy: %7.1f MiB/s\n  through the upload proxy: %7.1f MiB/s\n  ratio: %.2f (goal >= 0.80)\n",
		mib, rate(plain), rate(proxied), plain.Seconds()/proxied.Seconds())
}
