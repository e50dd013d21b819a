package admission

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestHandlerPlumbing(t *testing.T) {
	var seen *admissionv1.AdmissionRequest
	srv := httptest.NewServer(Handler("test", func(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		seen = req
		return forbidden("no")
	}))
	defer srv.Close()

	body, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  &admissionv1.AdmissionRequest{UID: types.UID("uid-1"), Operation: admissionv1.Create},
	})
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if seen == nil || out.Kind != "AdmissionReview" || out.APIVersion != "admission.k8s.io/v1" || out.Response == nil ||
		out.Response.UID != "uid-1" || out.Response.Allowed || out.Response.Result.Code != http.StatusForbidden {
		t.Fatalf("response %+v", out)
	}

	for name, tc := range map[string]struct {
		method, ctype, body string
		want                int
	}{
		"GET":          {http.MethodGet, "application/json", "", http.StatusMethodNotAllowed},
		"yaml":         {http.MethodPost, "application/yaml", string(body), http.StatusUnsupportedMediaType},
		"not a review": {http.MethodPost, "application/json", `{"kind":"Pod"}`, http.StatusBadRequest},
		"garbage":      {http.MethodPost, "application/json", `{{{`, http.StatusBadRequest},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", tc.ctype)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: status %d, want %d", name, resp.StatusCode, tc.want)
		}
	}
}
