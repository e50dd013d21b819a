package controller

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"
)

// NewScheme returns a scheme that knows the core Kubernetes types and
// Kubefill's API groups.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(cdiv1.AddToScheme(s))
	utilruntime.Must(uploadv1.AddToScheme(s))
	return s
}
