package cloner

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

// benchImage is the benchmark volume: 2 GiB virtual holding 1 GiB
// of data (half random, half text) in 16 extents of 64 MiB.
func benchImage(b *testing.B, dir string, virtual int64) string {
	src := mkdir(b, dir, "src")
	var regions []region
	for i := int64(0); i < 16; i++ {
		regions = append(regions, region{off: i * 128 * MiB, len: 64 * MiB, text: i%2 == 1})
	}
	makeImage(b, filepath.Join(src, ImageName), virtual, regions)
	return src
}

// cloneOnce streams src into dst in this process, sender and receiver
// connected by a pipe, as the cloner and the upload server would be.
func cloneOnce(b *testing.B, src, dst string, c Compression) (streamBytes int64) {
	pr, pw := io.Pipe()
	cr := &countReader{r: pr}
	errc := make(chan error, 1)
	go func() {
		_, err := WriteStream(context.Background(), pw, Source{Mode: Filesystem, Path: src, Compression: c}, nil)
		pw.CloseWithError(err)
		errc <- err
	}()
	if _, err := ReceiveStream(context.Background(), cr, ContentTypeFilesystem, Destination{Mode: Filesystem, Path: dst}); err != nil {
		b.Fatal(err)
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return cr.n
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func timeCmd(b *testing.B, name string, args ...string) time.Duration {
	start := time.Now()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		b.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return time.Since(start)
}

// BenchmarkCloneFilesystem measures a host-assisted FS→FS clone of the
// benchmark volume against cp --sparse=always of the same disk.img on the
// same disk, interleaved, both fsynced (the receiver fsyncs before it
// reports success; `sync FILE` does the same for cp). Run it alone:
//
//	go test -run '^$' -bench CloneFilesystem -benchtime 5x ./pkg/cloner/
func BenchmarkCloneFilesystem(b *testing.B) {
	b.Run("2GiB-auto", func(b *testing.B) { benchClone(b, 2*GiB, CompressAuto) })
	b.Run("2GiB-compress-all", func(b *testing.B) { benchClone(b, 2*GiB, CompressAll) })
	b.Run("20GiB-auto", func(b *testing.B) { benchClone(b, 20*GiB, CompressAuto) })
}

func benchClone(b *testing.B, virtual int64, c Compression) {
	if _, err := exec.LookPath("cp"); err != nil {
		b.Skip("no cp")
	}
	dir := tempDir(b)
	src := benchImage(b, dir, virtual)
	img := filepath.Join(src, ImageName)
	sha := contentDigest(b, img)
	testimg.PrefixSHA256(b, img, GiB) // warms the page cache
	var clone, cp, cpNoSync time.Duration
	var streamBytes int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst := filepath.Join(dir, "dst"+strconv.Itoa(i))
		mkdir(b, dst)
		start := time.Now()
		streamBytes = cloneOnce(b, src, dst, c)
		clone += time.Since(start)

		cpDst := filepath.Join(dir, "cp"+strconv.Itoa(i))
		start = time.Now()
		timeCmd(b, "cp", "--sparse=always", img, cpDst)
		cpNoSync += time.Since(start)
		timeCmd(b, "sync", cpDst)
		cp += time.Since(start)

		b.StopTimer()
		if i == 0 {
			if got := contentDigest(b, filepath.Join(dst, ImageName)); got != sha {
				b.Fatalf("clone differs")
			}
		}
		os.RemoveAll(dst)
		os.Remove(cpDst)
		b.StartTimer()
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(clone.Seconds()/n, "clone-s")
	b.ReportMetric(cp.Seconds()/n, "cp+sync-s")
	b.ReportMetric(cpNoSync.Seconds()/n, "cp-s")
	b.ReportMetric(cp.Seconds()/clone.Seconds(), "throughput-vs-cp+sync")
	b.ReportMetric(cpNoSync.Seconds()/clone.Seconds(), "throughput-vs-cp")
	b.ReportMetric(float64(streamBytes)/MiB, "stream-MiB")
	b.ReportMetric(float64(peakRSS())/MiB, "peak-RSS-MiB")
}

// peakRSS is this process's VmHWM (both ends of the clone, plus the test).
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkCloneBlock: a 2 GiB device (a file standing in for one) holding
// 1 GiB, Block→Block: every byte is read, zeros travel compressed and are
// punched on the target; against cp --sparse=always of the same file.
func BenchmarkCloneBlock(b *testing.B) {
	dir := tempDir(b)
	src := benchImage(b, dir, 2*GiB)
	dev := filepath.Join(src, ImageName)
	want := contentDigest(b, dev)
	var clone, cp time.Duration
	var streamBytes int64
	for i := 0; i < b.N; i++ {
		dst := filepath.Join(dir, "dev"+strconv.Itoa(i))
		f, err := os.Create(dst)
		if err != nil {
			b.Fatal(err)
		}
		f.Truncate(2 * GiB) // the target device
		f.Close()
		start := time.Now()
		pr, pw := io.Pipe()
		cr := &countReader{r: pr}
		go func() {
			_, err := WriteStream(context.Background(), pw, Source{Mode: Block, Path: dev}, nil)
			pw.CloseWithError(err)
		}()
		if _, err := ReceiveStream(context.Background(), cr, ContentTypeBlock, Destination{Mode: Block, Path: dst}); err != nil {
			b.Fatal(err)
		}
		clone += time.Since(start)
		streamBytes = cr.n
		cpDst := filepath.Join(dir, "cp"+strconv.Itoa(i))
		start = time.Now()
		timeCmd(b, "cp", "--sparse=always", dev, cpDst)
		timeCmd(b, "sync", cpDst)
		cp += time.Since(start)
		if i == 0 && contentDigest(b, dst) != want {
			b.Fatal("clone differs")
		}
		os.Remove(dst)
		os.Remove(cpDst)
	}
	b.ReportMetric(clone.Seconds()/float64(b.N), "clone-s")
	b.ReportMetric(cp.Seconds()/float64(b.N), "cp+sync-s")
	b.ReportMetric(cp.Seconds()/clone.Seconds(), "throughput-vs-cp+sync")
	b.ReportMetric(float64(streamBytes)/MiB, "stream-MiB")
}
