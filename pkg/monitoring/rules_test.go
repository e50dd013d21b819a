package monitoring

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/kubefill/kubefill/pkg/controller"
)

// prometheusRule is the part of a monitoring.coreos.com/v1 PrometheusRule
// the checks read.
type prometheusRule struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []rule `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

type rule struct {
	Record      string            `json:"record"`
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// external are the metrics the rules read that others export: Prometheus
// itself (up).
var external = map[string]string{
	"up": "Prometheus's scrape health of the controller pods",
}

// knownElsewhere are Kubefill metrics registered by controllers outside the
// collectors controller.ControllerMetricNames describes.
var knownElsewhere = map[string]string{
	"kubevirt_cdi_dataimportcron_outdated": "the DataImportCron controller's gauge (labels ns, cron_name, pending)",
}

func repoFile(t *testing.T, parts ...string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(append([]string{filepath.Dir(file), "..", ".."}, parts...)...)
}

func loadRules(t *testing.T) prometheusRule {
	t.Helper()
	b, err := os.ReadFile(repoFile(t, "manifests", "monitoring", "prometheus-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pr prometheusRule
	if err := yaml.Unmarshal(b, &pr); err != nil {
		t.Fatalf("prometheus-rules.yaml: %v", err)
	}
	return pr
}

// metricNames are the metric names an expression selects.
func metricNames(expr parser.Expr) []string {
	var names []string
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" && !slices.Contains(names, vs.Name) {
			names = append(names, vs.Name)
		}
		return nil
	})
	sort.Strings(names)
	return names
}

// TestPrometheusRules parses every expression of prometheus-cdi-rules with
// Prometheus's own PromQL parser and checks that each metric it names is one
// Kubefill exports, a recording rule of the same object, or an external
// metric on the allow-list; and that the rules are CDI's: the eight alerts
// with their labels, durations and runbook URLs.
func TestPrometheusRules(t *testing.T) {
	pr := loadRules(t)
	if pr.Kind != "PrometheusRule" || pr.Metadata.Name != "prometheus-cdi-rules" {
		t.Fatalf("kind %q name %q, want PrometheusRule prometheus-cdi-rules", pr.Kind, pr.Metadata.Name)
	}
	if pr.Metadata.Labels["prometheus.cdi.kubevirt.io"] != "true" {
		t.Errorf("labels %v lack CDI's prometheus.cdi.kubevirt.io=true", pr.Metadata.Labels)
	}

	exported := map[string]string{}
	for _, n := range controller.ControllerMetricNames() {
		exported[n] = "the controller"
	}
	for _, want := range []string{"kubevirt_cdi_cr_ready", "kubevirt_cdi_datavolume_pending", "kubevirt_cdi_storageprofile_info"} {
		if exported[want] == "" {
			t.Errorf("the controller does not export %s (exports %v)", want, controller.ControllerMetricNames())
		}
	}
	for n, who := range knownElsewhere {
		exported[n] = who
	}
	records := map[string]bool{}
	var all []rule
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				records[r.Record] = true
			}
			all = append(all, r)
		}
	}

	p := parser.NewParser(parser.Options{})
	used := map[string]bool{}
	for _, r := range all {
		name := r.Record + r.Alert
		expr, err := p.ParseExpr(r.Expr)
		if err != nil {
			t.Errorf("%s: expression does not parse: %v\n%s", name, err, r.Expr)
			continue
		}
		for _, m := range metricNames(expr) {
			used[m] = true
			switch {
			case exported[m] != "", records[m], external[m] != "":
			default:
				t.Errorf("%s names metric %s, which Kubefill does not export, no rule records and is not an allowed external metric", name, m)
			}
		}
	}
	for r := range records {
		if !used[r] {
			t.Errorf("recording rule %s is read by no alert", r)
		}
	}

	// CDI's eight alerts, with CDI's labels, durations and runbook URLs.
	want := map[string]struct{ severity, impact, forDur string }{
		"CDIOperatorDown":                      {"warning", "critical", "5m"},
		"CDINotReady":                          {"warning", "critical", "5m"},
		"CDIDataVolumeUnusualRestartCount":     {"warning", "none", "5m"},
		"CDIStorageProfilesIncomplete":         {"info", "none", "5m"},
		"CDIDataImportCronOutdated":            {"info", "warning", "15m"},
		"CDINoDefaultStorageClass":             {"warning", "none", "5m"},
		"CDIMultipleDefaultVirtStorageClasses": {"warning", "none", "5m"},
		"CDIDefaultStorageClassDegraded":       {"warning", "none", "5m"},
	}
	seen := 0
	for _, r := range all {
		if r.Alert == "" {
			continue
		}
		seen++
		w, ok := want[r.Alert]
		if !ok {
			t.Errorf("alert %s is not one of CDI's", r.Alert)
			continue
		}
		if r.Labels["severity"] != w.severity || r.Labels["operator_health_impact"] != w.impact || r.For != w.forDur {
			t.Errorf("%s: severity %q impact %q for %q, want %q %q %q", r.Alert, r.Labels["severity"], r.Labels["operator_health_impact"], r.For, w.severity, w.impact, w.forDur)
		}
		if r.Labels["kubernetes_operator_part_of"] != "kubevirt" || r.Labels["kubernetes_operator_component"] != "containerized-data-importer" {
			t.Errorf("%s: labels %v lack CDI's operator labels", r.Alert, r.Labels)
		}
		if got := r.Annotations["runbook_url"]; got != "https://kubevirt.io/monitoring/runbooks/"+r.Alert {
			t.Errorf("%s: runbook_url %q", r.Alert, got)
		}
		if r.Annotations["summary"] == "" {
			t.Errorf("%s has no summary", r.Alert)
		}
	}
	if seen != len(want) {
		t.Errorf("%d alerts, want CDI's %d", seen, len(want))
	}
	for _, rec := range []string{"kubevirt_cdi_operator_up", "kubevirt_cdi_import_pods_high_restart", "kubevirt_cdi_upload_pods_high_restart", "kubevirt_cdi_clone_pods_high_restart"} {
		if !records[rec] {
			t.Errorf("recording rule %s missing", rec)
		}
	}
}

// TestOperatorUpCountsTheInstall checks that kubevirt_cdi_operator_up counts
// the controller's pods in the install namespace manifests/install uses,
// and that the rule object lives there too.
func TestOperatorUpCountsTheInstall(t *testing.T) {
	b, err := os.ReadFile(repoFile(t, "manifests", "install", "namespace.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ns struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(b, &ns); err != nil || ns.Metadata.Name == "" {
		t.Fatalf("manifests/install/namespace.yaml: %v %q", err, ns.Metadata.Name)
	}
	pr := loadRules(t)
	if pr.Metadata.Namespace != ns.Metadata.Name {
		t.Errorf("PrometheusRule in namespace %q, the install is in %q", pr.Metadata.Namespace, ns.Metadata.Name)
	}
	p := parser.NewParser(parser.Options{})
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Record != "kubevirt_cdi_operator_up" {
				continue
			}
			expr, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Fatal(err)
			}
			var matchers []string
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				if vs, ok := n.(*parser.VectorSelector); ok && vs.Name == "up" {
					for _, m := range vs.LabelMatchers {
						matchers = append(matchers, m.String())
					}
				}
				return nil
			})
			joined := strings.Join(matchers, ",")
			if !strings.Contains(joined, `namespace="`+ns.Metadata.Name+`"`) || !strings.Contains(joined, `pod=~"kubefill-controller-.*"`) {
				t.Errorf("kubevirt_cdi_operator_up selects up{%s}, want the install namespace %q and pods kubefill-controller-.*", joined, ns.Metadata.Name)
			}
			return
		}
	}
	t.Error("no kubevirt_cdi_operator_up recording rule")
}
