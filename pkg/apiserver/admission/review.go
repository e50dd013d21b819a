// Package admission holds Kubefill's admission webhooks: DataVolume
// validation, DataVolume mutation (clone authorisation and its token), and
// validation of the populator source kinds.
package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// Webhook paths, the same as CDI's.
const (
	PathDataVolumeValidate = "/datavolume-validate"
	PathDataVolumeMutate   = "/datavolume-mutate"
	PathPopulatorValidate  = "/populator-validate"
)

// AdmitFunc decides one AdmissionRequest.
type AdmitFunc func(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse

const maxReviewBody = 7 << 20

// Handler serves an AdmitFunc over HTTP as an admission.k8s.io/v1 webhook.
func Handler(name string, admit AdmitFunc) http.Handler {
	log := logf.Log.WithName("admission").WithName(name)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "admission webhooks accept POST only", http.StatusMethodNotAllowed)
			return
		}
		if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			http.Error(w, fmt.Sprintf("content type %q is not application/json", ct), http.StatusUnsupportedMediaType)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxReviewBody))
		if err != nil {
			http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
			return
		}
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
			http.Error(w, "body is not an AdmissionReview with a request", http.StatusBadRequest)
			return
		}
		resp := admit(r.Context(), review.Request)
		resp.UID = review.Request.UID
		logResponse(log, review.Request, resp)
		out := admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
			Response: resp,
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(out); err != nil {
			log.Error(err, "writing AdmissionReview response")
		}
	})
}

func logResponse(log logr.Logger, req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
	kv := []any{"operation", req.Operation, "kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name, "user", req.UserInfo.Username, "allowed", resp.Allowed}
	if resp.Result != nil && resp.Result.Message != "" {
		kv = append(kv, "message", resp.Result.Message)
	}
	if resp.Patch != nil {
		kv = append(kv, "patched", true)
	}
	log.V(1).Info("admission decision", kv...)
}

func allowed() *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Allowed: true}
}

// denied turns field errors into a 422 Invalid response whose message lists them all.
func denied(kind, name string, errs field.ErrorList) *admissionv1.AdmissionResponse {
	causes := make([]metav1.StatusCause, 0, len(errs))
	for _, e := range errs {
		causes = append(causes, metav1.StatusCause{Type: metav1.CauseType(e.Type), Message: e.ErrorBody(), Field: e.Field})
	}
	return &admissionv1.AdmissionResponse{
		Allowed: false,
		Result: &metav1.Status{
			Status:  metav1.StatusFailure,
			Code:    http.StatusUnprocessableEntity,
			Reason:  metav1.StatusReasonInvalid,
			Message: fmt.Sprintf("%s %q is invalid: %s", kind, name, errs.ToAggregate().Error()),
			Details: &metav1.StatusDetails{Name: name, Kind: kind, Causes: causes},
		},
	}
}

func forbidden(msg string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{
		Allowed: false,
		Result:  &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: msg},
	}
}

func internalError(err error) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{
		Allowed: false,
		Result:  &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError, Message: err.Error()},
	}
}

func badRequest(msg string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{
		Allowed: false,
		Result:  &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest, Message: msg},
	}
}
