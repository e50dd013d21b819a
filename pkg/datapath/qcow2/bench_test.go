package qcow2

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/kubefill/kubefill/pkg/datapath/sink"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

// BenchmarkExecute measures the plan on a local zlib-compressed qcow2
// (64 MiB virtual, half data). Run: go test -bench Execute ./pkg/datapath/qcow2/
func BenchmarkExecute(b *testing.B) {
	testimg.RequireQemuImg(b)
	dir := b.TempDir()
	raw := testimg.Raw(b, dir, 64<<20)
	img := testimg.Convert(b, raw, "raw", filepath.Join(dir, "z.qcow2"), "qcow2", "-c")
	f, err := os.Open(img)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	hb := make([]byte, HeaderLen)
	f.ReadAt(hb, 0)
	h, err := ParseHeader(hb)
	if err != nil {
		b.Fatal(err)
	}
	p, err := BuildPlan(context.Background(), f, h, st.Size())
	if err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(dir, "out.img")
	b.SetBytes(int64(h.Size))
	b.ResetTimer()
	for range b.N {
		tg, err := sink.Open(out, sink.Options{})
		if err != nil {
			b.Fatal(err)
		}
		var reqs atomic.Int64
		if err := Execute(context.Background(), p, fileFetcher(f, &reqs), tg, ExecOptions{}); err != nil {
			b.Fatal(err)
		}
		tg.Close()
	}
}
