package apiserver

import (
	"net/http"

	restful "github.com/emicklei/go-restful/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"
)

// APIGroup is the discovery document of upload.cdi.kubevirt.io.
func APIGroup() metav1.APIGroup {
	v := metav1.GroupVersionForDiscovery{GroupVersion: uploadv1.SchemeGroupVersion.String(), Version: uploadv1.SchemeGroupVersion.Version}
	return metav1.APIGroup{
		TypeMeta:         metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"},
		Name:             uploadv1.GroupName,
		Versions:         []metav1.GroupVersionForDiscovery{v},
		PreferredVersion: v,
	}
}

// APIResourceList is the discovery document of upload.cdi.kubevirt.io/v1beta1.
func APIResourceList() metav1.APIResourceList {
	return metav1.APIResourceList{
		TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
		GroupVersion: uploadv1.SchemeGroupVersion.String(),
		APIResources: []metav1.APIResource{{
			Name:         uploadTokenResource,
			SingularName: "uploadtokenrequest",
			Namespaced:   true,
			Group:        uploadv1.GroupName,
			Version:      uploadv1.SchemeGroupVersion.Version,
			Kind:         "UploadTokenRequest",
			Verbs:        metav1.Verbs{"create"},
		}},
	}
}

func (s *Server) getAPIGroupList(_ *restful.Request, resp *restful.Response) {
	list := metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{APIGroup()}}
	_ = resp.WriteHeaderAndJson(http.StatusOK, list, restful.MIME_JSON)
}

func (s *Server) getAPIGroup(_ *restful.Request, resp *restful.Response) {
	_ = resp.WriteHeaderAndJson(http.StatusOK, APIGroup(), restful.MIME_JSON)
}

func (s *Server) getAPIResourceList(_ *restful.Request, resp *restful.Response) {
	_ = resp.WriteHeaderAndJson(http.StatusOK, APIResourceList(), restful.MIME_JSON)
}

// uploadTokenRequestSchema is the OpenAPI schema of UploadTokenRequest, shared
// by the v2 and v3 documents (definitions are JSON Schema in both).
func uploadTokenRequestSchema() map[string]any {
	str := map[string]any{"type": "string"}
	return map[string]any{
		"type":        "object",
		"description": "UploadTokenRequest asks for a short-lived token that lets its bearer upload into one PersistentVolumeClaim through the upload proxy.",
		"required":    []string{"spec"},
		"properties": map[string]any{
			"apiVersion": str,
			"kind":       str,
			"metadata":   map[string]any{"type": "object"},
			"spec": map[string]any{
				"type":       "object",
				"required":   []string{"pvcName"},
				"properties": map[string]any{"pvcName": map[string]any{"type": "string", "description": "name of the claim to upload into"}},
			},
			"status": map[string]any{
				"type":       "object",
				"properties": map[string]any{"token": map[string]any{"type": "string", "description": "the token to send as Authorization: Bearer to the upload proxy"}},
			},
		},
		"x-kubernetes-group-version-kind": []map[string]string{{"group": uploadv1.GroupName, "version": uploadv1.SchemeGroupVersion.Version, "kind": "UploadTokenRequest"}},
	}
}

const schemaName = "io.kubevirt.cdi.upload.v1beta1.UploadTokenRequest"

func tokenRequestPath() string {
	return "/apis/" + uploadv1.SchemeGroupVersion.String() + "/namespaces/{namespace}/" + uploadTokenResource
}

func (s *Server) openAPIV2(_ *restful.Request, resp *restful.Response) {
	doc := map[string]any{
		"swagger": "2.0",
		"info":    map[string]any{"title": "Kubefill upload API", "version": uploadv1.SchemeGroupVersion.Version},
		"paths": map[string]any{
			tokenRequestPath(): map[string]any{
				"parameters": []map[string]any{{"name": "namespace", "in": "path", "required": true, "type": "string"}},
				"post": map[string]any{
					"operationId": "createNamespacedUploadTokenRequest",
					"consumes":    []string{"application/json"},
					"produces":    []string{"application/json"},
					"parameters":  []map[string]any{{"name": "body", "in": "body", "required": true, "schema": map[string]any{"$ref": "#/definitions/" + schemaName}}},
					"responses": map[string]any{
						"201": map[string]any{"description": "Created", "schema": map[string]any{"$ref": "#/definitions/" + schemaName}},
						"401": map[string]any{"description": "Unauthorized"},
						"403": map[string]any{"description": "Forbidden"},
					},
					"x-kubernetes-action":             "post",
					"x-kubernetes-group-version-kind": map[string]string{"group": uploadv1.GroupName, "version": uploadv1.SchemeGroupVersion.Version, "kind": "UploadTokenRequest"},
				},
			},
		},
		"definitions": map[string]any{schemaName: uploadTokenRequestSchema()},
	}
	_ = resp.WriteHeaderAndJson(http.StatusOK, doc, restful.MIME_JSON)
}

func (s *Server) openAPIV3Index(_ *restful.Request, resp *restful.Response) {
	gvPath := "apis/" + uploadv1.SchemeGroupVersion.String()
	doc := map[string]any{"paths": map[string]any{gvPath: map[string]any{"serverRelativeURL": "/openapi/v3/" + gvPath}}}
	_ = resp.WriteHeaderAndJson(http.StatusOK, doc, restful.MIME_JSON)
}

func (s *Server) openAPIV3GroupVersion(req *restful.Request, resp *restful.Response) {
	if req.PathParameter("group") != uploadv1.GroupName || req.PathParameter("version") != uploadv1.SchemeGroupVersion.Version {
		writeStatus(resp, http.StatusNotFound, metav1.StatusReasonNotFound, "no OpenAPI document for this group version", nil)
		return
	}
	ref := map[string]any{"$ref": "#/components/schemas/" + schemaName}
	doc := map[string]any{
		"openapi": "3.0.0",
		"info":    map[string]any{"title": "Kubefill upload API", "version": uploadv1.SchemeGroupVersion.Version},
		"paths": map[string]any{
			tokenRequestPath(): map[string]any{
				"parameters": []map[string]any{{"name": "namespace", "in": "path", "required": true, "schema": map[string]any{"type": "string"}}},
				"post": map[string]any{
					"operationId": "createNamespacedUploadTokenRequest",
					"requestBody": map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{"schema": ref}}},
					"responses": map[string]any{
						"201": map[string]any{"description": "Created", "content": map[string]any{"application/json": map[string]any{"schema": ref}}},
					},
				},
			},
		},
		"components": map[string]any{"schemas": map[string]any{schemaName: uploadTokenRequestSchema()}},
	}
	_ = resp.WriteHeaderAndJson(http.StatusOK, doc, restful.MIME_JSON)
}
