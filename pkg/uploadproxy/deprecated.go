package uploadproxy

import (
	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/contract"
)

// Names that moved, kept while tests/ still use them here. They go once
// nothing does.

// UploadServerPort is the port the upload server listens on in its pod.
//
// Deprecated: use contract.UploadServerPort.
const UploadServerPort = contract.UploadServerPort

// UploadPodName is the name of the upload pod, and of its Service, serving the claim named serving.
//
// Deprecated: use cdiv1.UploadPodName.
func UploadPodName(serving string) string { return cdiv1.UploadPodName(serving) }
