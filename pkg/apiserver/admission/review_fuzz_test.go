package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

// FuzzReview: whatever body reaches a webhook, the answer is an
// AdmissionReview response (allowed, or denied with a code and a message)
// or a 4xx with a message; never a panic, never a 5xx, never a silent
// denial. The DataVolume validator (without a client) and the populator
// validator decide the requests that decode.
func FuzzReview(f *testing.F) {
	review := func(kind, op string, obj string) []byte {
		b, _ := json.Marshal(map[string]any{
			"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
			"request": map[string]any{
				"uid": "u1", "operation": op, "namespace": "ns", "name": "dv",
				"kind":   map[string]string{"group": "cdi.kubevirt.io", "version": "v1beta1", "kind": kind},
				"object": json.RawMessage(obj), "oldObject": json.RawMessage(obj),
			},
		})
		return b
	}
	dv := `{"apiVersion":"cdi.kubevirt.io/v1beta1","kind":"DataVolume","metadata":{"name":"dv"},"spec":{"source":{"http":{"url":"https://h/d.qcow2"}},"storage":{"resources":{"requests":{"storage":"1Gi"}}}}}`
	f.Add(review("DataVolume", "CREATE", dv))
	f.Add(review("DataVolume", "UPDATE", dv))
	f.Add(review("DataVolume", "CREATE", `{"spec":{"source":{"http":{}},"pvc":{"resources":{"requests":{"storage":"ten"}}}}}`))
	f.Add(review("VolumeImportSource", "CREATE", `{"spec":{"source":{"blank":{}}}}`))
	f.Add(review("VolumeCloneSource", "UPDATE", `{"spec":{"source":{"kind":"PersistentVolumeClaim","name":"x"}}}`))
	f.Add([]byte(`{"request":null}`))
	f.Add([]byte(`{{{`))
	f.Add([]byte(`{"request":{"object":{"raw":1}}}`))
	handlers := []http.Handler{
		Handler("dv", (&DataVolumeValidator{}).Admit),
		Handler("populator", AdmitPopulator),
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, h := range handlers {
			req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			switch {
			case w.Code >= 400 && w.Code < 500:
				if len(bytes.TrimSpace(w.Body.Bytes())) == 0 {
					t.Fatalf("status %d without a message", w.Code)
				}
			case w.Code == http.StatusOK:
				var out admissionv1.AdmissionReview
				if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
					t.Fatalf("200 without an AdmissionReview response: %v: %s", err, w.Body.Bytes())
				}
				var in admissionv1.AdmissionReview
				_ = json.Unmarshal(body, &in)
				if in.Request != nil && out.Response.UID != in.Request.UID {
					t.Fatalf("response UID %q for request %q", out.Response.UID, in.Request.UID)
				}
				if !out.Response.Allowed {
					r := out.Response.Result
					if r == nil || r.Message == "" || r.Code < 400 || r.Code >= 500 {
						t.Fatalf("denied without a 4xx code and a message: %+v", r)
					}
				}
			default:
				t.Fatalf("status %d: %s", w.Code, w.Body.Bytes())
			}
		}
	})
}
