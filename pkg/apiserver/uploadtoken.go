package apiserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	restful "github.com/emicklei/go-restful/v3"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"

	"github.com/kubefill/kubefill/pkg/token"
)

const (
	uploadTokenResource = "uploadtokenrequests"
	maxRequestBody      = 1 << 20
)

// UploadTargetError says why a PVC cannot receive an upload; pure so that it is
// testable without a cluster.
func UploadTargetError(pvc *corev1.PersistentVolumeClaim) error {
	where := pvc.Namespace + "/" + pvc.Name
	if pvc.DeletionTimestamp != nil {
		return fmt.Errorf("PersistentVolumeClaim %s is being deleted", where)
	}
	if !cdiv1.IsUploadTarget(pvc) {
		return fmt.Errorf("PersistentVolumeClaim %s is not an upload target: it has neither the %s annotation nor a dataSourceRef to a %s.%s; create it from a DataVolume with source.upload or with that dataSourceRef",
			where, cdiv1.AnnUploadRequest, cdiv1.VolumeUploadSourceRef, cdiv1.GroupName)
	}
	if cdiv1.IsCompleted(pvc) {
		return fmt.Errorf("PersistentVolumeClaim %s has already received its upload", where)
	}
	return nil
}

func (s *Server) uploadTokenRoutes(ws *restful.WebService) {
	ws.Route(ws.POST("/namespaces/{namespace}/" + uploadTokenResource).
		To(s.createUploadToken).
		Doc("Issue a short-lived token that allows an upload into one PersistentVolumeClaim").
		Param(ws.PathParameter("namespace", "namespace of the claim")).
		Consumes(restful.MIME_JSON).
		Produces(restful.MIME_JSON).
		Reads(uploadv1.UploadTokenRequest{}).
		Writes(uploadv1.UploadTokenRequest{}))
}

func (s *Server) createUploadToken(req *restful.Request, resp *restful.Response) {
	ctx := req.Request.Context()
	log := s.log.WithValues("path", req.Request.URL.Path)
	user, err := s.cfg.Auth.Authenticate(req.Request)
	if err != nil {
		log.V(1).Info("rejecting unauthenticated request", "reason", err.Error())
		writeStatus(resp, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized", nil)
		return
	}
	ns := req.PathParameter("namespace")
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		writeStatus(resp, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("invalid namespace %q: %s", ns, strings.Join(errs, "; ")), nil)
		return
	}
	attrs := authorizationv1.ResourceAttributes{
		Namespace: ns, Verb: "create", Group: uploadv1.GroupName, Version: uploadv1.SchemeGroupVersion.Version, Resource: uploadTokenResource,
	}
	allowed, reason, err := s.cfg.Authorizer.Authorize(ctx, user, attrs)
	if err != nil {
		log.Error(err, "authorizing upload token request")
		writeStatus(resp, http.StatusInternalServerError, metav1.StatusReasonInternalError, "authorization check failed: "+err.Error(), nil)
		return
	}
	details := &metav1.StatusDetails{Group: uploadv1.GroupName, Kind: uploadTokenResource}
	if !allowed {
		writeStatus(resp, http.StatusForbidden, metav1.StatusReasonForbidden, ForbiddenMessage(user, attrs, reason), details)
		return
	}

	body, err := io.ReadAll(io.LimitReader(req.Request.Body, maxRequestBody+1))
	if err != nil {
		writeStatus(resp, http.StatusBadRequest, metav1.StatusReasonBadRequest, "reading request body: "+err.Error(), details)
		return
	}
	if len(body) > maxRequestBody {
		writeStatus(resp, http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge, "request body is larger than 1 MiB", details)
		return
	}
	utr := &uploadv1.UploadTokenRequest{}
	if err := json.Unmarshal(body, utr); err != nil {
		writeStatus(resp, http.StatusBadRequest, metav1.StatusReasonBadRequest, "request body is not an UploadTokenRequest: "+err.Error(), details)
		return
	}
	if msg := checkUploadTokenRequest(utr, ns); msg != "" {
		writeStatus(resp, http.StatusBadRequest, metav1.StatusReasonBadRequest, msg, details)
		return
	}
	pvcName := utr.Spec.PvcName
	details.Name = pvcName
	pvc, err := s.cfg.Kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, pvcName, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			writeStatus(resp, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("PersistentVolumeClaim %s/%s not found", ns, pvcName), details)
			return
		}
		log.Error(err, "reading PVC", "pvc", ns+"/"+pvcName)
		writeStatus(resp, http.StatusInternalServerError, metav1.StatusReasonInternalError, fmt.Sprintf("reading PersistentVolumeClaim %s/%s: %v", ns, pvcName, err), details)
		return
	}
	if err := UploadTargetError(pvc); err != nil {
		writeStatus(resp, http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error(), details)
		return
	}
	tok, err := s.cfg.UploadTokens.Generate(token.NewUploadPayload(ns, pvcName))
	if err != nil {
		log.Error(err, "generating upload token")
		writeStatus(resp, http.StatusInternalServerError, metav1.StatusReasonInternalError, "generating token: "+err.Error(), details)
		return
	}
	utr.APIVersion = uploadv1.SchemeGroupVersion.String()
	utr.Kind = "UploadTokenRequest"
	utr.Namespace = ns
	if utr.Name == "" && utr.GenerateName != "" {
		utr.Name = utr.GenerateName + utilrand.String(5)
	}
	utr.CreationTimestamp = metav1.Now()
	utr.Status.Token = tok
	log.Info("issued upload token", "user", user.Name, "pvc", ns+"/"+pvcName)
	if err := resp.WriteHeaderAndJson(http.StatusCreated, utr, restful.MIME_JSON); err != nil {
		log.Error(err, "writing response")
	}
}

// checkUploadTokenRequest returns a message for a request that cannot be honoured.
func checkUploadTokenRequest(utr *uploadv1.UploadTokenRequest, ns string) string {
	var bad []string
	if utr.APIVersion != "" && utr.APIVersion != uploadv1.SchemeGroupVersion.String() {
		bad = append(bad, fmt.Sprintf("apiVersion is %q, want %q", utr.APIVersion, uploadv1.SchemeGroupVersion.String()))
	}
	if utr.Kind != "" && utr.Kind != "UploadTokenRequest" {
		bad = append(bad, fmt.Sprintf("kind is %q, want UploadTokenRequest", utr.Kind))
	}
	if utr.Namespace != "" && utr.Namespace != ns {
		bad = append(bad, fmt.Sprintf("metadata.namespace %q does not match the namespace %q in the URL", utr.Namespace, ns))
	}
	if utr.Spec.PvcName == "" {
		bad = append(bad, "spec.pvcName is required")
	} else if errs := validation.IsDNS1123Subdomain(utr.Spec.PvcName); len(errs) > 0 {
		bad = append(bad, fmt.Sprintf("spec.pvcName %q is not a valid claim name: %s", utr.Spec.PvcName, strings.Join(errs, "; ")))
	}
	return strings.Join(bad, "; ")
}

// writeStatus answers with a metav1.Status, the error body Kubernetes clients parse.
func writeStatus(resp *restful.Response, code int, reason metav1.StatusReason, msg string, details *metav1.StatusDetails) {
	st := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  msg,
		Reason:   reason,
		Details:  details,
		Code:     int32(code),
	}
	_ = resp.WriteHeaderAndJson(code, st, restful.MIME_JSON)
}

var errNotReady = errors.New("not ready")
