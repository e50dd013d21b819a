package importer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/kubefill/kubefill/pkg/datapath"
	"github.com/kubefill/kubefill/pkg/datapath/qcow2"
	"github.com/kubefill/kubefill/pkg/datapath/sink"
	"github.com/kubefill/kubefill/pkg/datapath/source"
)

type statusLike struct{ permanent bool }

func (s statusLike) Error() string   { return "HTTP status" }
func (s statusLike) Permanent() bool { return s.permanent }

func TestPermanent(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"checksum", fmt.Errorf("import: %w", datapath.ErrChecksum), true},
		{"too big", fmt.Errorf("writing: %w", sink.ErrTooBig), true},
		{"hostile qcow2", fmt.Errorf("header: %w", qcow2.ErrUnsafe), true},
		{"client error status", fmt.Errorf("GET: %w", statusLike{permanent: true}), true},
		{"server error status", fmt.Errorf("GET: %w", statusLike{permanent: false}), false},
		{"connection drop", fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), false},
		{"cancelled", context.Canceled, false},
		{"plain", errors.New("something else"), false},
		{"truncated qcow2", fmt.Errorf("plan: %w", qcow2.ErrInvalid), true},
		{"http 404", fmt.Errorf("open: %w", &source.StatusError{Code: 404}), true},
		{"http 429", fmt.Errorf("open: %w", &source.StatusError{Code: 429}), false},
		{"range protocol violation", fmt.Errorf("open: %w", &source.StatusError{Msg: "ignored Range"}), false},
	}
	for _, c := range cases {
		if got := Permanent(c.err); got != c.want {
			t.Errorf("%s: Permanent = %v, want %v", c.name, got, c.want)
		}
	}
}
