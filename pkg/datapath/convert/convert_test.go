package convert

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubefill/kubefill/pkg/datapath/testimg"
)

func TestParseInfoTable(t *testing.T) {
	const p = "/scratch/img"
	tests := []struct {
		name, json, wantErr string
	}{
		{"plain", `{"virtual-size": 1048576, "filename": "/scratch/img", "format": "vmdk"}`, ""},
		{"vmdk own extent", `{"virtual-size": 1048576, "filename": "/scratch/img", "format-specific": {"type": "vmdk", "data": {"extents": [{"filename": "/scratch/img", "format": "SPARSE"}]}}}`, ""},
		{"vmdk flat extent elsewhere", `{"virtual-size": 1048576, "filename": "/scratch/img", "format-specific": {"type": "vmdk", "data": {"extents": [{"filename": "/etc/shadow", "format": "FLAT"}]}}}`, "refers to another file"},
		{"backing", `{"virtual-size": 1, "filename": "/scratch/img", "backing-filename": "/etc/passwd"}`, "backing file"},
		{"json backing", `{"virtual-size": 1, "filename": "json:{\"file\":{}}"}`, "json:"},
		{"data file", `{"virtual-size": 1, "filename": "/scratch/img", "format-specific": {"type": "qcow2", "data": {"data-file": "/dev/sda"}}}`, "external data file"},
		{"zero size", `{"virtual-size": 0, "filename": "/scratch/img"}`, "virtual size"},
		{"garbage", `not json`, "parsing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseInfo([]byte(tc.json), p)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestConvertFormats(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	raw := testimg.Raw(t, dir, 8<<20)
	want := testimg.RawSHA256(t, raw, "raw")
	ctx := context.Background()
	for _, f := range []string{"vmdk", "vdi", "vpc", "vhdx", "qcow2"} {
		img := testimg.Convert(t, raw, "raw", filepath.Join(dir, "img."+f), f)
		info, err := QueryInfo(ctx, img, f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if info.VirtualSize < 8<<20 {
			t.Fatalf("%s: virtual size %d", f, info.VirtualSize)
		}
		out := filepath.Join(dir, f+".out")
		if err := ToRaw(ctx, img, f, out, false); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		// vpc rounds the size up to its CHS geometry; compare the data part.
		if err := os.Truncate(out, 8<<20); err != nil {
			t.Fatal(err)
		}
		if got := testimg.FileSHA256(t, out); got != want {
			t.Fatalf("%s: sha256 %s want %s", f, got, want)
		}
	}
}

func TestHostileImagesRefused(t *testing.T) {
	testimg.RequireQemuImg(t)
	dir := t.TempDir()
	ctx := context.Background()
	secret := filepath.Join(dir, "host-secret")
	if err := os.WriteFile(secret, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(dir, "overlay.qcow2")
	testimg.QemuImg(t, "create", "-q", "-f", "qcow2", "-b", secret, "-F", "raw", overlay, "1M")
	datafile := filepath.Join(dir, "datafile.qcow2")
	testimg.QemuImg(t, "create", "-q", "-f", "qcow2", "-o", "data_file="+secret, datafile, "1M")
	desc := filepath.Join(dir, "desc.vmdk")
	descriptor := "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\n\nRW 2048 FLAT \"" + secret + "\" 0\n\nddb.virtualHWVersion = \"4\"\n"
	if err := os.WriteFile(desc, []byte(descriptor), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, fmt, want string }{
		{overlay, "qcow2", "backing file"},
		{datafile, "qcow2", "external data file"},
		{desc, "vmdk", "refers to another file"},
	} {
		_, err := QueryInfo(ctx, c.path, c.fmt)
		if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: err %v, want %q", filepath.Base(c.path), err, c.want)
		}
		t.Logf("%s refused: %v", filepath.Base(c.path), err)
	}
	if _, err := QueryInfo(ctx, overlay, ""); err == nil {
		t.Fatal("info without a format must be refused")
	}
}
