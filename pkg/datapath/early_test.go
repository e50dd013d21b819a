package datapath

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

// A vmdk or vhdx image whose virtual size does not fit the target is
// refused from its own headers, before it is spooled or converted: with
// the first bytes of the stream, ranges of the source, or (compressed) the
// first few MiB spooled. The message gives both sizes.
func TestTooSmallTargetRefusedBeforeTheTransfer(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	// A 4 GiB disk with 24 MiB of data, so that the image files are large
	// enough to tell an early refusal from a late one.
	raw := filepath.Join(dir, "src.raw")
	sh := func(cmdline string) {
		t.Helper()
		if out, err := exec.Command("sh", "-c", cmdline).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmdline, err, out)
		}
	}
	sh("head -c 25165824 /dev/urandom > " + raw + " && truncate -s 4G " + raw)
	testimg.Convert(t, raw, "raw", filepath.Join(dir, "big.vhdx"), "vhdx")
	testimg.Convert(t, raw, "raw", filepath.Join(dir, "big.vmdk"), "vmdk")
	testimg.Convert(t, raw, "raw", filepath.Join(dir, "big-stream.vmdk"), "vmdk", "-o", "subformat=streamOptimized")
	os.Remove(raw)
	sh("cd " + dir + " && gzip -k -1 big.vhdx && gzip -k -1 big.vmdk")
	srv := testimg.NewServer(t, dir, false)

	for _, c := range []struct {
		file, format string
		maxRead      int64 // bytes of the source consumed before the refusal
		scratch      bool
	}{
		{"big.vhdx", "vhdx", 1 << 20, false},              // ranges of the source
		{"big.vmdk", "vmdk", 1 << 20, false},              // the embedded descriptor in the first 64 KiB
		{"big-stream.vmdk", "vmdk", 1 << 20, false},       // streamOptimized: the header's capacity
		{"big.vmdk.gz", "vmdk", 1 << 20, false},           // the decompressed first 64 KiB
		{"big.vhdx.gz", "vhdx", probeBytes + 4<<20, true}, // the first 8 MiB spooled
	} {
		t.Run(c.file, func(t *testing.T) {
			fi, err := os.Stat(filepath.Join(dir, c.file))
			if err != nil {
				t.Fatal(err)
			}
			var read int64
			opt := Options{Path: outPath(t), Size: 1 << 30, Log: testr.New(t), Progress: func(done, _ int64) { read = done }}
			if c.scratch {
				opt.ScratchDir = t.TempDir()
			}
			_, err = Import(context.Background(), httpSrc(t, srv.FileURL(c.file), nil), opt)
			if !errors.Is(err, ErrTooBig) {
				t.Fatalf("err %v, want ErrTooBig", err)
			}
			want := "the " + c.format + " virtual size is 4294967296 bytes (4.0 GiB) but only 1073741824 bytes (1.0 GiB) of the target are usable"
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("message %q lacks %q", err, want)
			}
			if read > c.maxRead || read >= fi.Size() {
				t.Fatalf("read %d bytes of %d before refusing, want at most %d", read, fi.Size(), c.maxRead)
			}
			if st, err := os.Stat(opt.Path); err == nil && st.Size() != 0 {
				t.Fatalf("the target holds %d bytes", st.Size())
			}
			t.Logf("%s: refused after reading %d of %d bytes: %v", c.file, read, fi.Size(), err)
		})
	}
}
