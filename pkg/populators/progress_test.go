package populators

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

func TestParseProgressMetric(t *testing.T) {
	const metric = "kubevirt_cdi_import_progress_total"
	text := `# HELP kubevirt_cdi_import_progress_total The import progress in percentage
# TYPE kubevirt_cdi_import_progress_total counter
kubevirt_cdi_import_progress_total{ownerUID="other"} 12
kubevirt_cdi_import_progress_total{ownerUID="u-1"} 45.2
kubevirt_cdi_import_progress_total{ownerUID="stamped"} 7.5 1700000000000
kubevirt_cdi_import_progress_total{ownerUID="tiny"} 1.5e-05
kubevirt_cdi_import_progress_total{ownerUID="nan"} NaN
kubevirt_cdi_import_progress_total{ownerUID="broken"} x
kubevirt_cdi_import_progress_total_extra{ownerUID="extra"} 3
`
	cases := []struct {
		owner   string
		want    float64
		wantErr string
	}{
		{"u-1", 45.2, ""},
		{"other", 12, ""},
		{"stamped", 7.5, ""},
		{"tiny", 1.5e-05, ""},
		{"u", 0, "not found"},
		{"missing", 0, "not found"},
		{"extra", 0, "not found"},
		{"nan", 0, "not a percentage"},
		{"broken", 0, "invalid syntax"},
	}
	for _, c := range cases {
		v, err := ParseProgressMetric(text, metric, c.owner)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: got %v, %v; want an error containing %q", c.owner, v, err, c.wantErr)
			}
			continue
		}
		if err != nil || v != c.want {
			t.Errorf("%s: got %v, %v; want %v", c.owner, v, err, c.want)
		}
	}
}

// TestScrapeProgress reads the metric named by the caller from a real TLS
// /metrics endpoint at the pod's IP and port, as for the importer and the
// upload server, and reports a worker that does not answer.
func TestScrapeProgress(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, `kubevirt_cdi_import_progress_total{ownerUID="uid-1"} 37.5`)
		fmt.Fprintln(w, `kubevirt_cdi_clone_progress_total{ownerUID="uid-1"} 12`)
	}))
	defer srv.Close()
	host, portText, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(portText)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "worker", Labels: map[string]string{cdiv1.LabelOwnedByUID: "uid-1"}},
		Status: corev1.PodStatus{PodIP: host}}
	for metric, want := range map[string]float64{"kubevirt_cdi_import_progress_total": 37.5, "kubevirt_cdi_clone_progress_total": 12} {
		if got, err := ScrapeProgress(context.Background(), pod, int32(port), metric); err != nil || got != want {
			t.Errorf("%s: %v, %v; want %v", metric, got, err, want)
		}
	}
	if _, err := ScrapeProgress(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "new"}}, int32(port), contract.ImportProgressMetric); err == nil || !strings.Contains(err.Error(), "no IP") {
		t.Errorf("a pod without an IP: %v", err)
	}
	srv.Close()
	if _, err := ScrapeProgress(context.Background(), pod, int32(port), contract.ImportProgressMetric); err == nil || !strings.Contains(err.Error(), "scraping https://") {
		t.Errorf("a worker that is gone: %v", err)
	}
}

func TestFilesystemOverhead(t *testing.T) {
	config := &cdiv1.CDIConfig{Status: cdiv1.CDIConfigStatus{FilesystemOverhead: &cdiv1.FilesystemOverhead{
		Global: "0.1", StorageClass: map[string]cdiv1.Percent{"fast": "0.02"}}}}
	for sc, want := range map[string]string{"fast": "0.02", "slow": "0.1"} {
		if got := FilesystemOverhead(config, sc); got != want {
			t.Errorf("%s: %s, want %s", sc, got, want)
		}
	}
	if got := FilesystemOverhead(&cdiv1.CDIConfig{}, "any"); got != "0.06" {
		t.Errorf("default overhead %s, want 0.06", got)
	}
}
