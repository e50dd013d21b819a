package importer

import (
	"errors"

	"github.com/kubefill/kubefill/pkg/datapath"
	"github.com/kubefill/kubefill/pkg/datapath/archive"
	"github.com/kubefill/kubefill/pkg/datapath/convert"
	"github.com/kubefill/kubefill/pkg/datapath/qcow2"
	"github.com/kubefill/kubefill/pkg/datapath/sink"
	"github.com/kubefill/kubefill/pkg/datapath/source"
)

// permanentErrors are failures the same input will always hit again.
var permanentErrors = []error{
	datapath.ErrChecksum,
	datapath.ErrUnsupported,
	sink.ErrTooBig,
	archive.ErrTooBig,
	archive.ErrUnsafe,
	convert.ErrUnsafe,
	qcow2.ErrUnsafe,
	qcow2.ErrInvalid,
	source.ErrNoDisk,
}

// Permanent reports whether an import failure cannot be fixed by retrying:
// the user has to change the source, the checksum or the size.
func Permanent(err error) bool {
	for _, target := range permanentErrors {
		if errors.Is(err, target) {
			return true
		}
	}
	var classified interface{ Permanent() bool }
	return errors.As(err, &classified) && classified.Permanent()
}
