package installed

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/storage"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// metricsService is the Service of manifests/monitoring that Prometheus
// (through the ServiceMonitor) scrapes the controller by.
const metricsService = "kubefill-prometheus-metrics"

// monitoringServices reads the plain Services of manifests/monitoring: the
// part of it that needs no Prometheus operator.
func monitoringServices() ([]*unstructured.Unstructured, error) {
	objs, err := cluster.ManifestObjects(filepath.Join(repoRoot(), "manifests", "monitoring"), "")
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == "Service" && u.GetAPIVersion() == "v1" {
			out = append(out, u)
		}
	}
	return out, nil
}

// ruleMetrics are the metric names the PrometheusRule's expressions select,
// read with Prometheus's own PromQL parser.
func ruleMetrics(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(), "manifests", "monitoring", "prometheus-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Expr string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &pr); err != nil {
		t.Fatal(err)
	}
	p := parser.NewParser(parser.Options{})
	var names []string
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			expr, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Fatalf("rule expression does not parse: %v\n%s", err, r.Expr)
			}
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" && !slices.Contains(names, vs.Name) {
					names = append(names, vs.Name)
				}
				return nil
			})
		}
	}
	sort.Strings(names)
	return names
}

// scrape GETs url and parses Prometheus's text format.
func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET %s: %s %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parsing the scrape of %s: %w", url, err)
	}
	return fams, nil
}

func labelsOf(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// series writes a sample as the text format does: name{k="v",...}.
func series(name string, m *dto.Metric) string {
	var ls []string
	for _, p := range m.GetLabel() {
		ls = append(ls, fmt.Sprintf("%s=%q", p.GetName(), p.GetValue()))
	}
	if len(ls) == 0 {
		return fmt.Sprintf("%s %v", name, gaugeValue(m))
	}
	return fmt.Sprintf("%s{%s} %v", name, strings.Join(ls, ","), gaugeValue(m))
}

func gaugeValue(m *dto.Metric) float64 {
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetUntyped().GetValue()
}

// TestInstalledMetrics scrapes the installed controller's metrics endpoint
// as Prometheus would: through the metrics Service of manifests/monitoring
// (plain HTTP, as its ServiceMonitor says; controller-runtime's metrics
// server without authentication), from the host over the node's network.
func TestInstalledMetrics(t *testing.T) {
	ctx := context.Background()

	// manifests/monitoring's Service; the PrometheusRule and the
	// ServiceMonitor need the Prometheus operator's CRDs, absent here.
	svcs, err := monitoringServices()
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs) == 0 {
		t.Fatal("manifests/monitoring/service-monitor.yaml has no Service")
	}
	for _, u := range svcs {
		if err := installer.Apply(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	svc := &corev1.Service{}
	if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: metricsService}, svc); err != nil {
		t.Fatalf("the metrics Service: %v", err)
	}
	port := int32(0)
	for _, p := range svc.Spec.Ports {
		if p.Name == "metrics" {
			port = p.Port
		}
	}
	if port == 0 {
		t.Fatalf("Service %s has no port named metrics: %+v", metricsService, svc.Spec.Ports)
	}
	url := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(port)) + "/metrics"

	// The Service selects the controller pod: its endpoints are what the
	// ServiceMonitor turns into scrape targets.
	var targets []string
	kit.Eventually(t, time.Minute, time.Second, "the metrics Service to have the controller pod as endpoint", func() (bool, string, error) {
		pods := &corev1.PodList{}
		if err := kc.List(ctx, pods, client.InNamespace(installNS), client.MatchingLabels(svc.Spec.Selector)); err != nil {
			return false, err.Error(), nil
		}
		targets = targets[:0]
		for _, p := range pods.Items {
			if !strings.HasPrefix(p.Name, "kubefill-controller-") {
				return false, "the Service selects pod " + p.Name + ", not only the controller", nil
			}
			if p.Status.PodIP != "" {
				targets = append(targets, p.Name+" "+p.Status.PodIP)
			}
		}
		return len(targets) > 0, fmt.Sprint(len(pods.Items), " pods"), nil
	})
	t.Logf("scraping %s (Service %s/%s, selecting %v)", url, installNS, metricsService, targets)

	// The CDI resource (TestInstalled makes it; alone, this test does).
	cr := &cdiv1.CDI{}
	if err := kc.Get(ctx, types.NamespacedName{Name: "cdi"}, cr); err != nil {
		cr = &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}}
		if err := kc.Create(ctx, cr); err != nil {
			t.Fatalf("creating the CDI resource: %v", err)
		}
	}
	kit.Eventually(t, 2*time.Minute, time.Second, "the CDI resource to be Deployed", func() (bool, string, error) {
		if err := kc.Get(ctx, client.ObjectKeyFromObject(cr), cr); err != nil {
			return false, err.Error(), nil
		}
		return cr.Status.Phase == cdiv1.CDIPhaseDeployed, string(cr.Status.Phase), nil
	})

	// A DataImportCron whose source never answers: the cron is outdated,
	// so kubevirt_cdi_dataimportcron_outdated has a series for it.
	ns := "installed-metrics"
	if err := kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	defer func() { _ = kc.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}) }()
	unreachable := "docker://127.0.0.1:1/nothing:latest"
	cron := &cdiv1.DataImportCron{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "never-current"},
		Spec: cdiv1.DataImportCronSpec{
			Schedule:          "0 0 1 1 *",
			ManagedDataSource: "never-current",
			Template: cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{
				Source:  &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: &unreachable}},
				Storage: storageSpec("16Mi")}},
		}}
	if err := kc.Create(ctx, cron); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = kc.Delete(ctx, cron) }()

	// A DataVolume on the default class that cannot start: it clones a
	// claim that does not exist, so it waits, counted by
	// kubevirt_cdi_datavolume_pending while its phase is Pending.
	waiting := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "waits-for-source"},
		Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: "not-there"}},
			Storage: storageSpec("16Mi")}}
	if err := kc.Create(ctx, waiting); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = kc.Delete(ctx, waiting) }()

	classes := &storagev1.StorageClassList{}
	if err := kc.List(ctx, classes); err != nil {
		t.Fatal(err)
	}
	if len(classes.Items) == 0 {
		t.Fatal("the cluster has no StorageClass")
	}

	var (
		fams    map[string]*dto.MetricFamily
		dvs     = &cdiv1.DataVolumeList{}
		pending float64
	)
	kit.Eventually(t, 2*time.Minute, 2*time.Second, "the scrape to show the install's state", func() (bool, string, error) {
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		var err error
		if fams, err = scrape(sctx, url); err != nil {
			return false, err.Error(), nil
		}
		if f := fams["kubevirt_cdi_cr_ready"]; f == nil || len(f.Metric) != 1 || gaugeValue(f.Metric[0]) != 1 {
			return false, fmt.Sprintf("kubevirt_cdi_cr_ready %v", f.GetMetric()), nil
		}
		// kubevirt_cdi_datavolume_pending: the DataVolumes waiting for a
		// default storage class, as the controller counts them from the
		// objects (listed here after the scrape; the phases only settle).
		f := fams["kubevirt_cdi_datavolume_pending"]
		if f == nil || len(f.Metric) != 1 {
			return false, fmt.Sprintf("kubevirt_cdi_datavolume_pending %v, want one series", f.GetMetric()), nil
		}
		if err := kc.List(ctx, dvs); err != nil {
			return false, err.Error(), nil
		}
		if pending = gaugeValue(f.Metric[0]); pending != float64(controller.CountPending(dvs.Items)) || pending < 1 {
			return false, fmt.Sprintf("kubevirt_cdi_datavolume_pending %v, the DataVolumes say %d (want at least %s/%s)",
				pending, controller.CountPending(dvs.Items), ns, waiting.Name), nil
		}
		f = fams["kubevirt_cdi_dataimportcron_outdated"]
		for _, m := range f.GetMetric() {
			l := labelsOf(m)
			if l["ns"] == ns && l["cron_name"] == cron.Name && gaugeValue(m) == 1 {
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("kubevirt_cdi_dataimportcron_outdated %v", f.GetMetric()), nil
	})

	// kubevirt_cdi_cr_ready 1: the resource is Deployed (checked above).
	t.Logf("%s (CDI %s phase %s)", series("kubevirt_cdi_cr_ready", fams["kubevirt_cdi_cr_ready"].Metric[0]), cr.Name, cr.Status.Phase)
	for _, m := range fams["kubevirt_cdi_dataimportcron_outdated"].GetMetric() {
		t.Logf("%s", series("kubevirt_cdi_dataimportcron_outdated", m))
	}

	// kubevirt_cdi_storageprofile_info: one series per StorageClass, value
	// 1, with the class's provisioner and default flag.
	info := fams["kubevirt_cdi_storageprofile_info"]
	for _, sc := range classes.Items {
		found := false
		for _, m := range info.GetMetric() {
			l := labelsOf(m)
			if l["storageclass"] != sc.Name {
				continue
			}
			found = true
			t.Logf("%s", series("kubevirt_cdi_storageprofile_info", m))
			if gaugeValue(m) != 1 {
				t.Errorf("kubevirt_cdi_storageprofile_info for %s is %v, want 1", sc.Name, gaugeValue(m))
			}
			if l["provisioner"] != sc.Provisioner {
				t.Errorf("kubevirt_cdi_storageprofile_info for %s has provisioner %q, want %q", sc.Name, l["provisioner"], sc.Provisioner)
			}
			if want := fmt.Sprint(storage.IsDefaultClass(&sc)); l["default"] != want {
				t.Errorf("kubevirt_cdi_storageprofile_info for %s has default=%q, want %q", sc.Name, l["default"], want)
			}
		}
		if !found {
			t.Errorf("no kubevirt_cdi_storageprofile_info series for StorageClass %s (series: %v)", sc.Name, info.GetMetric())
		}
	}

	for _, dv := range dvs.Items {
		if dv.Name == waiting.Name && dv.Namespace == ns {
			t.Logf("kubevirt_cdi_datavolume_pending %v (%d DataVolumes; %s/%s is %q)", pending, len(dvs.Items), ns, dv.Name, dv.Status.Phase)
		}
	}

	// Every metric the PrometheusRule reads that Kubefill exports is in
	// the scrape (the others are recording rules and Prometheus's or
	// kube-state-metrics' own).
	ours := append(controller.ControllerMetricNames(), "kubevirt_cdi_dataimportcron_outdated")
	checked := 0
	for _, name := range ruleMetrics(t) {
		if !slices.Contains(ours, name) {
			continue
		}
		checked++
		if f := fams[name]; f == nil || len(f.Metric) == 0 {
			t.Errorf("the rules read %s, which the controller exports, but the scrape has no series of it", name)
		}
	}
	if checked < 4 {
		t.Errorf("only %d of the rules' metrics are ones Kubefill exports; want kubevirt_cdi_cr_ready, _datavolume_pending, _storageprofile_info, _dataimportcron_outdated", checked)
	}
	t.Logf("the %d Kubefill metrics the PrometheusRule reads are all in the scrape (%d families in all)", checked, len(fams))
}
