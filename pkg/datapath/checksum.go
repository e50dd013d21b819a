package datapath

import (
	"crypto/md5"  //nolint:gosec // user-selected checksum algorithm, not for security
	"crypto/sha1" //nolint:gosec // user-selected checksum algorithm, not for security
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strings"
)

// ErrChecksum marks a source whose digest does not match the expected one.
var ErrChecksum = errors.New("checksum mismatch")

// Checksum is an expected digest of the source bytes, written "algo:hex"
// with algo one of md5, sha1, sha256 or sha512.
type Checksum struct {
	Algo string
	Sum  []byte
}

var checksumAlgos = map[string]struct {
	size int
	new  func() hash.Hash
}{
	"md5":    {md5.Size, md5.New},
	"sha1":   {sha1.Size, sha1.New},
	"sha256": {sha256.Size, sha256.New},
	"sha512": {sha512.Size, sha512.New},
}

// ParseChecksum parses "algo:hex". An empty string means no checksum (nil).
func ParseChecksum(s string) (*Checksum, error) {
	if s == "" {
		return nil, nil
	}
	algo, hexSum, ok := strings.Cut(s, ":")
	if !ok {
		return nil, fmt.Errorf("invalid checksum %q: want algorithm:hex, e.g. sha256:<64 hex digits>", s)
	}
	algo = strings.ToLower(algo)
	a, known := checksumAlgos[algo]
	if !known {
		return nil, fmt.Errorf("invalid checksum: unsupported algorithm %q (use md5, sha1, sha256 or sha512)", algo)
	}
	sum, err := hex.DecodeString(hexSum)
	if err != nil || len(sum) != a.size {
		return nil, fmt.Errorf("invalid checksum: %s needs %d hex digits", algo, 2*a.size)
	}
	return &Checksum{Algo: algo, Sum: sum}, nil
}

// New returns a fresh hash for the checksum's algorithm.
func (c *Checksum) New() hash.Hash { return checksumAlgos[c.Algo].new() }

// String formats the checksum as "algo:hex".
func (c *Checksum) String() string { return c.Algo + ":" + hex.EncodeToString(c.Sum) }

// Verify compares h's digest with the expected one.
func (c *Checksum) Verify(h hash.Hash) error {
	got := h.Sum(nil)
	if !equalBytes(got, c.Sum) {
		return fmt.Errorf("%w: the source's %s is %x, expected %x", ErrChecksum, c.Algo, got, c.Sum)
	}
	return nil
}

func equalBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
