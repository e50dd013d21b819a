package cloner

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
)

// A source pod told to stop mid-stream (SIGTERM: its namespace deleted,
// the pod evicted) cancels its context. The server must see a cut body and
// fail, never a clean end it would report as a complete clone.
func TestCancelledSourceNeverEndsTheStreamCleanly(t *testing.T) {
	dir := tempDir(t)
	dst := mkdir(t, dir, "dst")
	got := make(chan error, 1)
	_, job := tlsUpload(t, func(w http.ResponseWriter, r *http.Request) {
		_, err := ReceiveStream(r.Context(), r.Body, r.Header.Get(HeaderContentType), Destination{Mode: Filesystem, Path: dst})
		got <- err
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	})
	for _, mode := range []Mode{Filesystem, Block} {
		t.Run(string(ContentTypeFor(mode)), func(t *testing.T) {
			src := mkdir(t, dir, "src-"+ContentTypeFor(mode))
			img := filepath.Join(src, ImageName)
			makeImage(t, img, 64*MiB, []region{{off: 0, len: 32 * MiB}})
			job.Source = Source{Mode: Filesystem, Path: src}
			if mode == Block {
				// A Block source is read as a device: the image file stands in.
				job.Source = Source{Mode: Block, Path: img}
			}
			client, target, err := uploadClient(job)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, err = upload(ctx, client, target, job, func(done, total int64) {
				if done >= 4*MiB {
					cancel()
				}
			})
			if err == nil {
				t.Errorf("upload of a cancelled stream returned success")
			}
			if serr := <-got; serr == nil {
				t.Errorf("the server accepted a stream whose source was cancelled mid-way (client: %v)", err)
			} else {
				t.Logf("client: %v; server: %v", err, serr)
			}
		})
	}
}
