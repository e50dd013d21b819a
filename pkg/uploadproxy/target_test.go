package uploadproxy

import (
	"net/http"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func claim(name string, ann map[string]string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Name: name, Annotations: ann}}
}

func uploadSourceClaim(name string, ann map[string]string) *corev1.PersistentVolumeClaim {
	c := claim(name, ann)
	group := cdiv1.GroupName
	c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: cdiv1.VolumeUploadSourceRef, Name: "src"}
	return c
}

func importSourceClaim(name string) *corev1.PersistentVolumeClaim {
	c := claim(name, nil)
	group := cdiv1.GroupName
	c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: cdiv1.VolumeImportSourceRef, Name: "src"}
	return c
}

func TestDecideTarget(t *testing.T) {
	now := metav1.Now()
	deleting := claim("disk", map[string]string{cdiv1.AnnUploadRequest: ""})
	deleting.DeletionTimestamp = &now
	const prime = "prime-1234"
	tests := []struct {
		name        string
		pvc, prime  *corev1.PersistentVolumeClaim
		want        TargetState
		wantServing string
	}{
		{"plain claim, no upload annotation", claim("disk", nil), nil, TargetInvalid, ""},
		{"import populator's claim", importSourceClaim("disk"), nil, TargetInvalid, ""},
		{"being deleted", deleting, nil, TargetInvalid, ""},
		{"legacy upload claim, pod not ready", claim("disk", map[string]string{cdiv1.AnnUploadRequest: ""}), nil, TargetWaiting, "disk"},
		{"legacy upload claim, pod ready", claim("disk", map[string]string{cdiv1.AnnUploadRequest: "", cdiv1.AnnPodReady: "true"}), nil, TargetReady, "disk"},
		{"legacy upload claim, pod ready false", claim("disk", map[string]string{cdiv1.AnnUploadRequest: "", cdiv1.AnnPodReady: "false"}), nil, TargetWaiting, "disk"},
		{"legacy upload claim, succeeded", claim("disk", map[string]string{cdiv1.AnnUploadRequest: "", cdiv1.AnnPodPhase: "Succeeded"}), nil, TargetCompleted, ""},
		{"populator, prime not named yet", claim("disk", map[string]string{cdiv1.AnnUploadRequest: "", cdiv1.AnnUsePopulator: "true"}), nil, TargetWaiting, ""},
		{"dataSourceRef, prime not named yet", uploadSourceClaim("disk", nil), nil, TargetWaiting, ""},
		{"populator, prime named but absent", claim("disk", map[string]string{cdiv1.AnnUsePopulator: "true", cdiv1.AnnPVCPrimeName: prime}), nil, TargetWaiting, prime},
		{"populator, prime not ready", uploadSourceClaim("disk", map[string]string{cdiv1.AnnPVCPrimeName: prime}), claim(prime, nil), TargetWaiting, prime},
		{"populator, prime ready", uploadSourceClaim("disk", map[string]string{cdiv1.AnnPVCPrimeName: prime}), claim(prime, map[string]string{cdiv1.AnnPodReady: "true"}), TargetReady, prime},
		{"populator, readiness mirrored on the target", claim("disk", map[string]string{cdiv1.AnnUsePopulator: "true", cdiv1.AnnPVCPrimeName: prime, cdiv1.AnnPodReady: "true"}), claim(prime, nil), TargetReady, prime},
		{"prime annotation without usePopulator is followed", claim("disk", map[string]string{cdiv1.AnnPVCPrimeName: prime}), claim(prime, map[string]string{cdiv1.AnnPodReady: "true"}), TargetReady, prime},
		{"target already populated", uploadSourceClaim("disk", map[string]string{cdiv1.AnnPVCPrimeName: prime, cdiv1.AnnPopulatedFor: "disk"}), nil, TargetCompleted, ""},
		{"prime's pod succeeded", uploadSourceClaim("disk", map[string]string{cdiv1.AnnPVCPrimeName: prime, cdiv1.AnnPodReady: "true"}), claim(prime, map[string]string{cdiv1.AnnPodPhase: "Succeeded"}), TargetCompleted, ""},
		{"target pod phase succeeded", uploadSourceClaim("disk", map[string]string{cdiv1.AnnPodPhase: "Succeeded"}), nil, TargetCompleted, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := DecideTarget(tc.pvc, tc.prime)
			if d.State != tc.want || d.Serving != tc.wantServing {
				t.Fatalf("DecideTarget = %s serving %q (%s), want %s serving %q", d.State, d.Serving, d.Reason, tc.want, tc.wantServing)
			}
			if d.State != TargetReady && d.Reason == "" {
				t.Errorf("state %s has no reason for the user", d.State)
			}
		})
	}
}

func TestNamesAndStatus(t *testing.T) {
	if got := ServiceHost("vms", "prime-1"); got != "cdi-upload-prime-1.vms.svc" {
		t.Errorf("ServiceHost = %q", got)
	}
	if got := HTTPStatus(statusErrorf(http.StatusConflict, "x")); got != http.StatusConflict {
		t.Errorf("HTTPStatus(conflict) = %d", got)
	}
	if got := HTTPStatus(http.ErrHandlerTimeout); got != http.StatusBadGateway {
		t.Errorf("HTTPStatus(other) = %d", got)
	}
	for p, want := range map[string]bool{"/v1beta1/upload-async": true, "/v1alpha1/upload-form-async": true, "/v1beta1/upload": false, "/v1beta1/upload-archive": false} {
		if IsAsyncPath(p) != want {
			t.Errorf("IsAsyncPath(%s) != %v", p, want)
		}
	}
	if len(UploadPaths) != 10 {
		t.Errorf("UploadPaths has %d paths, want 10: %v", len(UploadPaths), UploadPaths)
	}
}
