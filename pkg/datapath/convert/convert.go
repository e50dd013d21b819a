// Package convert runs qemu-img safely: the input format is always given
// explicitly (-f, qemu-img never probes), `qemu-img info --output=json` is
// checked for anything that would make qemu-img open other files (backing
// files, external data files, json: pseudo-filenames, vmdk extents that
// point elsewhere), and every run is under resource limits.
package convert

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ErrUnsafe marks images refused because qemu-img would read other files.
var ErrUnsafe = errors.New("unsafe disk image")

// Limits bound a qemu-img process.
type Limits struct {
	AddressSpace int64 // bytes of virtual memory (RLIMIT_AS)
	CPUSeconds   int64 // RLIMIT_CPU
}

// InfoLimits mirror what CDI uses for qemu-img info.
var InfoLimits = Limits{AddressSpace: 1 << 30, CPUSeconds: 30}

// ConvertLimits bound qemu-img convert's memory; CPU time is not limited
// because large images legitimately take long.
var ConvertLimits = Limits{AddressSpace: 4 << 30}

// Info is the subset of `qemu-img info --output=json` we use.
type Info struct {
	VirtualSize int64  `json:"virtual-size"`
	Format      string `json:"format"`
	Filename    string `json:"filename"`
	ActualSize  int64  `json:"actual-size"`
}

// command builds qemu-img args wrapped in prlimit when available.
func command(ctx context.Context, lim Limits, args ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if p, err := exec.LookPath("prlimit"); err == nil && (lim.AddressSpace > 0 || lim.CPUSeconds > 0) {
		pa := []string{}
		if lim.AddressSpace > 0 {
			pa = append(pa, "--as="+strconv.FormatInt(lim.AddressSpace, 10))
		}
		if lim.CPUSeconds > 0 {
			pa = append(pa, "--cpu="+strconv.FormatInt(lim.CPUSeconds, 10))
		}
		pa = append(append(pa, "qemu-img"), args...)
		cmd = exec.CommandContext(ctx, p, pa...)
	} else {
		cmd = exec.CommandContext(ctx, "qemu-img", args...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// QueryInfo runs qemu-img info on path read as format and refuses unsafe
// images. path should be absolute.
func QueryInfo(ctx context.Context, path, format string) (*Info, error) {
	if format == "" {
		return nil, errors.New("qemu-img info: the input format must be explicit")
	}
	var stdout, stderr bytes.Buffer
	cmd := command(ctx, InfoLimits, "info", "--output=json", "-f", format, path)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("qemu-img info -f %s: %w: %s", format, err, strings.TrimSpace(stderr.String()))
	}
	return ParseInfo(stdout.Bytes(), path)
}

// ParseInfo parses qemu-img info JSON and applies the safety checks. It is
// pure: path is the file qemu-img was asked about, the only file an image
// may refer to.
func ParseInfo(out []byte, path string) (*Info, error) {
	var info Info
	if err := json.Unmarshal(out, &info); err != nil {
		return nil, fmt.Errorf("parsing qemu-img info output: %w", err)
	}
	var generic any
	if err := json.Unmarshal(out, &generic); err != nil {
		return nil, fmt.Errorf("parsing qemu-img info output: %w", err)
	}
	if err := checkSafe(generic, path, ""); err != nil {
		return nil, err
	}
	if info.VirtualSize <= 0 {
		return nil, fmt.Errorf("qemu-img reports virtual size %d", info.VirtualSize)
	}
	return &info, nil
}

func checkSafe(v any, path, key string) error {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			switch k {
			case "backing-filename", "full-backing-filename", "backing-image":
				return fmt.Errorf("%w: it has a backing file; only self-contained images can be imported", ErrUnsafe)
			case "data-file":
				return fmt.Errorf("%w: it uses an external data file", ErrUnsafe)
			case "filename":
				if s, ok := val.(string); ok && filepath.Clean(s) != filepath.Clean(path) {
					return fmt.Errorf("%w: it refers to another file (%s %q)", ErrUnsafe, key, s)
				}
			}
			if err := checkSafe(val, path, k); err != nil {
				return err
			}
		}
	case []any:
		for _, val := range x {
			if err := checkSafe(val, path, key); err != nil {
				return err
			}
		}
	case string:
		if strings.HasPrefix(x, "json:") {
			return fmt.Errorf("%w: it contains a json: pseudo-filename", ErrUnsafe)
		}
	}
	return nil
}

// ToRaw converts src (read as format) to a raw image at dst. For a block
// device or pre-created file pass existing=true: qemu-img then writes into
// it (-n) instead of creating it.
func ToRaw(ctx context.Context, src, format, dst string, existing bool) error {
	if format == "" {
		return errors.New("qemu-img convert: the input format must be explicit")
	}
	args := []string{"convert", "-q", "-t", "writeback", "-f", format, "-O", "raw"}
	if existing {
		args = append(args, "-n")
	}
	args = append(args, src, dst)
	var stderr bytes.Buffer
	cmd := command(ctx, ConvertLimits, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("qemu-img convert -f %s -O raw: %w: %s", format, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
