package populators

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// What every worker kind reads from the cluster and its pods: progress from
// a worker's metrics, and the filesystem overhead in force.

// ScrapeProgress reads metric{ownerUID=<the pod's owner>}, a percentage,
// from a worker pod's TLS /metrics endpoint on port: the importer's metrics
// server or the upload server. Neither asks for a client certificate there.
// The serving certificate is not verified (the importer's is self-signed,
// the upload server's names its Service, not the pod IP dialled): only a
// percentage is read.
func ScrapeProgress(ctx context.Context, pod *corev1.Pod, port int32, metric string) (float64, error) {
	if pod.Status.PodIP == "" {
		return 0, fmt.Errorf("pod %s has no IP yet", pod.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	url := "https://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(port))) + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("scraping %s: %w", url, err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // only a number is read
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, fmt.Errorf("scraping %s: %w", url, err)
	}
	return ParseProgressMetric(string(body), metric, pod.Labels[cdiv1.LabelOwnedByUID])
}

// ParseProgressMetric finds metric{ownerUID="uid"} in a Prometheus text
// exposition and returns its value, a percentage.
func ParseProgressMetric(text, metric, ownerUID string) (float64, error) {
	for _, line := range strings.Split(text, "\n") {
		end := strings.LastIndex(line, "}")
		if !strings.HasPrefix(line, metric+"{") || end < 0 || !strings.Contains(line[:end], `ownerUID="`+ownerUID+`"`) {
			continue
		}
		// The value follows the labels; an optional timestamp may follow it.
		fields := strings.Fields(line[end+1:])
		if len(fields) == 0 {
			return 0, fmt.Errorf("parsing %q: no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("parsing %q: %w", line, err)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("parsing %q: not a percentage", line)
		}
		return v, nil
	}
	return 0, fmt.Errorf("metric %s for owner %s not found", metric, ownerUID)
}

// FilesystemOverhead is the overhead in force for a StorageClass, as a
// string for the importer's environment.
func FilesystemOverhead(config *cdiv1.CDIConfig, storageClass string) string {
	if fo := config.Status.FilesystemOverhead; fo != nil {
		if v, ok := fo.StorageClass[storageClass]; ok && v != "" {
			return string(v)
		}
		if fo.Global != "" {
			return string(fo.Global)
		}
	}
	return string(cdiv1.DefaultFilesystemOverhead)
}
