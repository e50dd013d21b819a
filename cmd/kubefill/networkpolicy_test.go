package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// TestNetworkPolicies checks manifests/install/networkpolicy.yaml by its
// content (the local cluster's bridge CNI does not enforce NetworkPolicy,
// so no test sends packets): every pod of the install namespace is isolated
// for ingress; each port a Service of the install (or of
// manifests/monitoring) sends traffic to is allowed on the pods that
// Service selects; no other port is opened, every rule names its ports, and
// egress is left alone.
func TestNetworkPolicies(t *testing.T) {
	docs := readInstallManifests(t)
	policies := decodeAll[networkingv1.NetworkPolicy](t, docs, "NetworkPolicy")
	deployments := decodeAll[appsv1.Deployment](t, docs, "Deployment")
	services := decodeAll[corev1.Service](t, docs, "Service")
	monitoring, err := os.ReadFile(filepath.Join(installDir, "..", "monitoring", "service-monitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range splitYAML(t, monitoring) {
		var s corev1.Service
		if yaml.Unmarshal(d, &s) == nil && s.Kind == "Service" {
			services = append(services, s)
		}
	}
	if len(policies) == 0 {
		t.Fatal("no NetworkPolicy in manifests/install")
	}
	selects := func(p networkingv1.NetworkPolicy, podLabels map[string]string) bool {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil {
			t.Fatalf("NetworkPolicy %s: %v", p.Name, err)
		}
		return sel.Matches(labels.Set(podLabels))
	}
	// allowed says whether some policy selecting the pods allows TCP port
	// (a number, or a named container port of c).
	allowed := func(podLabels map[string]string, port int32, name string) bool {
		for _, p := range policies {
			if !selects(p, podLabels) {
				continue
			}
			for _, r := range p.Spec.Ingress {
				for _, pp := range r.Ports {
					if pp.Protocol != nil && *pp.Protocol != corev1.ProtocolTCP {
						continue
					}
					if pp.Port != nil && (pp.Port.Type == intstr.Int && pp.Port.IntVal == port || pp.Port.Type == intstr.String && pp.Port.StrVal == name) {
						return true
					}
				}
			}
		}
		return false
	}

	denyAll := false
	for _, p := range policies {
		if p.Namespace != installNamespace {
			t.Errorf("NetworkPolicy %s in namespace %q, want %s", p.Name, p.Namespace, installNamespace)
		}
		if !slices.Equal(p.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || len(p.Spec.Egress) > 0 {
			t.Errorf("NetworkPolicy %s: policyTypes %v, egress %v; want Ingress only (egress to kube-apiserver and registries must stay open)", p.Name, p.Spec.PolicyTypes, p.Spec.Egress)
		}
		if len(p.Spec.PodSelector.MatchLabels) == 0 && len(p.Spec.PodSelector.MatchExpressions) == 0 && len(p.Spec.Ingress) == 0 {
			denyAll = true
		}
		for i, r := range p.Spec.Ingress {
			if len(r.Ports) == 0 {
				t.Errorf("NetworkPolicy %s ingress rule %d names no port: it opens every port", p.Name, i)
			}
		}
	}
	if !denyAll {
		t.Error("no NetworkPolicy selects every pod with no ingress rule: pods not named by an allow policy (the poller's) accept anything")
	}

	// Every Service's target port is open on its pods; every open port is one a Service targets.
	opened := map[string]bool{}
	for _, s := range services {
		for _, d := range deployments {
			podLabels := d.Spec.Template.Labels
			if !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(podLabels)) || len(s.Spec.Selector) == 0 {
				continue
			}
			for _, sp := range s.Spec.Ports {
				for _, c := range d.Spec.Template.Spec.Containers {
					for _, cp := range c.Ports {
						if cp.Name != sp.TargetPort.String() && cp.ContainerPort != sp.TargetPort.IntVal {
							continue
						}
						if !allowed(podLabels, cp.ContainerPort, cp.Name) {
							t.Errorf("Service %s sends port %d to %s's container port %d (%s), which no NetworkPolicy allows", s.Name, sp.Port, d.Name, cp.ContainerPort, cp.Name)
						}
						opened[d.Name+"/"+cp.Name] = true
					}
				}
			}
		}
	}
	for _, d := range deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, cp := range c.Ports {
				if allowed(d.Spec.Template.Labels, cp.ContainerPort, cp.Name) && !opened[d.Name+"/"+cp.Name] {
					t.Errorf("%s's port %d (%s) is open to other pods but no Service targets it", d.Name, cp.ContainerPort, cp.Name)
				}
			}
		}
	}
	for _, want := range []string{"kubefill-apiserver/https", "kubefill-uploadproxy/https", "kubefill-controller/metrics"} {
		if !opened[want] {
			t.Errorf("%s is not reached through a Service and allowed", want)
		}
	}
}

// splitYAML splits a multi-document YAML file.
func splitYAML(t *testing.T, b []byte) [][]byte {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var out [][]byte
	for {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, raw)
	}
}
