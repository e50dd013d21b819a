// Package archive extracts a tar stream into a directory safely: absolute
// paths, "..", links that escape, device nodes and FIFOs are refused, all
// file operations go through an os.Root (so existing symlinks cannot be
// used to escape either), and the total size is bounded.
package archive

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// ErrUnsafe marks archives refused for safety reasons.
var ErrUnsafe = errors.New("unsafe archive")

// ErrTooBig is returned when the archive's content exceeds the limit.
var ErrTooBig = errors.New("archive content is larger than the target volume")

// CheckName validates a tar member name and returns its cleaned relative
// form. It is pure.
func CheckName(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: empty member name", ErrUnsafe)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: absolute path %q", ErrUnsafe, name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: path %q contains \"..\"", ErrUnsafe, name)
		}
	}
	clean := path.Clean(name)
	if clean == "." {
		return ".", nil
	}
	return clean, nil
}

// CheckLink validates that a symlink named name pointing at target stays
// inside the extraction root. It is pure.
func CheckLink(name, target string) error {
	if target == "" || strings.HasPrefix(target, "/") {
		return fmt.Errorf("%w: link %q points to absolute path %q", ErrUnsafe, name, target)
	}
	resolved := path.Join(path.Dir(name), target)
	if resolved == ".." || strings.HasPrefix(resolved, "../") {
		return fmt.Errorf("%w: link %q points outside the volume (%q)", ErrUnsafe, name, target)
	}
	return nil
}

// Extract writes the tar stream r into dir, refusing unsafe members. At
// most limit bytes of file content are written (0 = unlimited).
func Extract(r io.Reader, dir string, limit int64) (int64, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, fmt.Errorf("opening extraction directory: %w", err)
	}
	defer root.Close()
	tr := tar.NewReader(r)
	var total int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, fmt.Errorf("reading tar archive: %w", err)
		}
		name, err := CheckName(h.Name)
		if err != nil {
			return total, err
		}
		mode := os.FileMode(h.Mode) & 0o777
		switch h.Typeflag {
		case tar.TypeDir:
			if name == "." {
				continue
			}
			if err := root.MkdirAll(name, mode|0o700); err != nil {
				return total, fmt.Errorf("creating directory %q: %w", name, err)
			}
		case tar.TypeReg:
			if limit > 0 && total+h.Size > limit {
				return total, fmt.Errorf("%w: %q would bring the total to %d bytes, limit %d", ErrTooBig, name, total+h.Size, limit)
			}
			if err := mkParent(root, name); err != nil {
				return total, err
			}
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode|0o600)
			if err != nil {
				return total, fmt.Errorf("creating %q: %w", name, err)
			}
			n, err := io.Copy(f, tr)
			total += n
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return total, fmt.Errorf("writing %q: %w", name, err)
			}
		case tar.TypeSymlink:
			if err := CheckLink(name, h.Linkname); err != nil {
				return total, err
			}
			if err := mkParent(root, name); err != nil {
				return total, err
			}
			if err := root.Symlink(h.Linkname, name); err != nil {
				return total, fmt.Errorf("creating symlink %q: %w", name, err)
			}
		case tar.TypeLink:
			target, err := CheckName(h.Linkname)
			if err != nil {
				return total, fmt.Errorf("hard link %q: %w", name, err)
			}
			if err := mkParent(root, name); err != nil {
				return total, err
			}
			if err := root.Link(target, name); err != nil {
				return total, fmt.Errorf("creating hard link %q: %w", name, err)
			}
		case tar.TypeChar, tar.TypeBlock:
			return total, fmt.Errorf("%w: %q is a device node", ErrUnsafe, name)
		case tar.TypeFifo:
			return total, fmt.Errorf("%w: %q is a FIFO", ErrUnsafe, name)
		case tar.TypeXGlobalHeader, tar.TypeXHeader:
			continue
		default:
			return total, fmt.Errorf("%w: %q has unsupported tar type %q", ErrUnsafe, name, h.Typeflag)
		}
	}
}

func mkParent(root *os.Root, name string) error {
	if d := path.Dir(name); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating directory %q: %w", d, err)
		}
	}
	return nil
}
