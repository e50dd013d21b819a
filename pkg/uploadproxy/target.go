// Package uploadproxy is the user-facing upload endpoint: it checks the
// upload token, finds the upload pod that serves the token's claim, and
// streams the request body to it over mutual TLS without buffering it.
package uploadproxy

import (
	"errors"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// StatusError is an error with the HTTP status the proxy answers with.
type StatusError struct {
	Code int
	Msg  string
}

func (e *StatusError) Error() string { return e.Msg }

func statusErrorf(code int, format string, args ...any) error {
	return &StatusError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// HTTPStatus returns the status an error maps to: a StatusError's own code,
// 502 for anything else (a failure to reach the cluster or the upload pod).
func HTTPStatus(err error) int {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code
	}
	return http.StatusBadGateway
}

// TargetState is what the proxy can do with a claim right now.
type TargetState int

const (
	// TargetReady: the upload pod serving the claim is ready; proxy to it.
	TargetReady TargetState = iota
	// TargetWaiting: the claim will accept an upload, but its prime or pod is not there yet.
	TargetWaiting
	// TargetCompleted: the claim already received its upload (409).
	TargetCompleted
	// TargetInvalid: the claim is not an upload target at all (400).
	TargetInvalid
)

func (s TargetState) String() string {
	switch s {
	case TargetReady:
		return "Ready"
	case TargetWaiting:
		return "Waiting"
	case TargetCompleted:
		return "Completed"
	case TargetInvalid:
		return "Invalid"
	}
	return fmt.Sprintf("TargetState(%d)", int(s))
}

// Decision is the outcome of DecideTarget.
type Decision struct {
	State TargetState
	// Serving names the claim whose upload pod (cdi-upload-<Serving>) takes the
	// data: the prime for a populated claim, the claim itself otherwise.
	// Empty while the prime's name is not known yet.
	Serving string
	// Reason explains the state in words a user can act on.
	Reason string
}

// followsPrime says whether pvc names a PVC-prime or is marked to be filled
// through one. Such a claim is followed to its prime's upload pod even
// without the upload annotation or a VolumeUploadSource dataSourceRef; a
// claim that only refers to another populator's source is not (unlike
// cdiv1.UsesPopulator, which says yes to any populator).
func followsPrime(pvc *corev1.PersistentVolumeClaim) bool {
	_, named := pvc.Annotations[cdiv1.AnnPVCPrimeName]
	return named || pvc.Annotations[cdiv1.AnnUsePopulator] == "true"
}

func podReady(pvc *corev1.PersistentVolumeClaim) bool {
	return pvc != nil && pvc.Annotations[cdiv1.AnnPodReady] == "true"
}

// DecideTarget works out, without I/O, where an upload into pvc goes. prime
// is the claim named by pvc's AnnPVCPrimeName, or nil when there is none or
// it was not found.
func DecideTarget(pvc, prime *corev1.PersistentVolumeClaim) Decision {
	where := pvc.Namespace + "/" + pvc.Name
	if pvc.DeletionTimestamp != nil {
		return Decision{State: TargetInvalid, Reason: fmt.Sprintf("PersistentVolumeClaim %s is being deleted", where)}
	}
	if cdiv1.IsCompleted(pvc) || cdiv1.IsCompleted(prime) {
		return Decision{State: TargetCompleted, Reason: fmt.Sprintf("PersistentVolumeClaim %s has already received its upload; create a new DataVolume or PVC to upload again", where)}
	}
	if !cdiv1.IsUploadTarget(pvc) && !followsPrime(pvc) {
		return Decision{State: TargetInvalid, Reason: fmt.Sprintf("PersistentVolumeClaim %s is not an upload target: it has neither the %s annotation nor a dataSourceRef to a %s", where, cdiv1.AnnUploadRequest, cdiv1.VolumeUploadSourceRef)}
	}
	if !cdiv1.UsesPopulator(pvc) {
		if podReady(pvc) {
			return Decision{State: TargetReady, Serving: pvc.Name}
		}
		return Decision{State: TargetWaiting, Serving: pvc.Name, Reason: fmt.Sprintf("the upload pod of PersistentVolumeClaim %s is not ready yet", where)}
	}
	primeName := pvc.Annotations[cdiv1.AnnPVCPrimeName]
	if primeName == "" {
		return Decision{State: TargetWaiting, Reason: fmt.Sprintf("PersistentVolumeClaim %s has no %s annotation yet: the upload populator has not created its prime", where, cdiv1.AnnPVCPrimeName)}
	}
	if prime == nil {
		return Decision{State: TargetWaiting, Serving: primeName, Reason: fmt.Sprintf("the prime %s/%s of PersistentVolumeClaim %s does not exist yet", pvc.Namespace, primeName, where)}
	}
	// The populator mirrors the pod's readiness onto the target; either claim saying so is enough.
	if podReady(pvc) || podReady(prime) {
		return Decision{State: TargetReady, Serving: primeName}
	}
	return Decision{State: TargetWaiting, Serving: primeName, Reason: fmt.Sprintf("the upload pod %s of PersistentVolumeClaim %s is not ready yet", cdiv1.UploadPodName(primeName), where)}
}

// ServiceHost is the in-cluster DNS name of the upload Service of the
// claim serving, <service>.<namespace>.svc, with the Service's name the
// controller gives it (cdiv1.UploadServiceName: a DNS-1035 label, so the
// name stays in the namespace whatever the claim is called): what the
// proxy dials, and verifies on the upload pod's serving certificate.
func ServiceHost(namespace, serving string) string {
	return cdiv1.UploadServiceHost(namespace, serving)
}
