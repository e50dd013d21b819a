package controller

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// conds is a status's conditions as type → "Status/Reason".
func conds(st cdiv1.CDIStatus) map[string]string {
	out := map[string]string{}
	for _, c := range st.Conditions {
		out[c.Type] = string(c.Status) + "/" + c.Reason
	}
	return out
}

func withConds(phase cdiv1.CDIPhase, observed, target string, a, p, d string) cdiv1.CDIStatus {
	st := cdiv1.CDIStatus{Phase: phase, ObservedVersion: observed, TargetVersion: target, OperatorVersion: target}
	t0 := metav1.NewTime(time.Unix(1000, 0))
	for _, c := range []struct{ typ, v string }{{cdiv1.CDIConditionAvailable, a}, {cdiv1.CDIConditionProgressing, p}, {cdiv1.CDIConditionDegraded, d}} {
		st.Conditions = append(st.Conditions, cdiv1.OperatorCondition{Type: c.typ, Status: corev1.ConditionStatus(c.v), LastTransitionTime: t0, LastHeartbeatTime: t0})
	}
	return st
}

func TestNextCDIStatus(t *testing.T) {
	const v = "v1.2.3"
	notReady := []string{"Deployment kubefill-api (0/1 ready)"}
	cases := []struct {
		name      string
		cur       cdiv1.CDIStatus
		obs       CDIObservation
		phase     cdiv1.CDIPhase
		want      map[string]string
		observed  string
		readyGaug float64
		readySet  bool
	}{
		{"new, operands not ready: Deploying", cdiv1.CDIStatus{}, CDIObservation{Version: v, NotReady: notReady}, cdiv1.CDIPhaseDeploying,
			map[string]string{"Available": "False/", "Progressing": "True/DeployStarted", "Degraded": "False/"}, "", 0, false},
		{"new, operands ready: straight to Deployed", cdiv1.CDIStatus{}, CDIObservation{Version: v}, cdiv1.CDIPhaseDeployed,
			map[string]string{"Available": "True/DeployCompleted", "Progressing": "False/", "Degraded": "False/"}, v, 1, true},
		{"deploying, operands become ready", withConds(cdiv1.CDIPhaseDeploying, "", v, "False", "True", "False"), CDIObservation{Version: v}, cdiv1.CDIPhaseDeployed,
			map[string]string{"Available": "True/DeployCompleted", "Progressing": "False/", "Degraded": "False/"}, v, 1, true},
		{"deployed, an operand goes unready: Degraded", withConds(cdiv1.CDIPhaseDeployed, v, v, "True", "False", "False"), CDIObservation{Version: v, NotReady: notReady}, cdiv1.CDIPhaseDeployed,
			map[string]string{"Available": "True/", "Progressing": "False/", "Degraded": "True/"}, v, 1, true},
		{"deployed and degraded, ready again", withConds(cdiv1.CDIPhaseDeployed, v, v, "True", "False", "True"), CDIObservation{Version: v}, cdiv1.CDIPhaseDeployed,
			map[string]string{"Available": "True/", "Progressing": "False/", "Degraded": "False/"}, v, 1, true},
		{"a second CDI resource: Error", cdiv1.CDIStatus{}, CDIObservation{Version: v, Unwanted: true}, cdiv1.CDIPhaseError,
			map[string]string{"Available": "False/", "Progressing": "False/", "Degraded": "True/ConfigError"}, "", 0, true},
		{"Error is final", withConds(cdiv1.CDIPhaseError, "", "", "False", "False", "True"), CDIObservation{Version: v}, cdiv1.CDIPhaseError,
			map[string]string{"Available": "False/", "Progressing": "False/", "Degraded": "True/"}, "", 0, true},
		{"new version, operands not ready yet: Upgrading", withConds(cdiv1.CDIPhaseDeployed, "v1.0.0", "v1.0.0", "True", "False", "False"), CDIObservation{Version: v, NotReady: notReady}, cdiv1.CDIPhaseUpgrading,
			map[string]string{"Available": "True/", "Progressing": "True/", "Degraded": "True/UpgradeStarted"}, "v1.0.0", 1, true},
		{"upgrading, operands ready: Deployed at the new version", withConds(cdiv1.CDIPhaseUpgrading, "v1.0.0", v, "True", "True", "True"), CDIObservation{Version: v}, cdiv1.CDIPhaseDeployed,
			map[string]string{"Available": "True/DeployCompleted", "Progressing": "False/", "Degraded": "False/"}, v, 1, true},
	}
	now := metav1.NewTime(time.Unix(2000, 0))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := NextCDIStatus(c.cur, c.obs, now)
			if got.Phase != c.phase {
				t.Errorf("phase %q, want %q", got.Phase, c.phase)
			}
			gc := conds(got)
			for typ, want := range c.want {
				if gc[typ] != want {
					t.Errorf("condition %s = %s, want %s (all %v)", typ, gc[typ], want, gc)
				}
			}
			if len(gc) != 3 {
				t.Errorf("conditions %v, want exactly Available, Progressing and Degraded", gc)
			}
			if got.ObservedVersion != c.observed {
				t.Errorf("observedVersion %q, want %q", got.ObservedVersion, c.observed)
			}
			if c.phase != cdiv1.CDIPhaseError && (got.OperatorVersion != v || got.TargetVersion != v) {
				t.Errorf("operatorVersion %q targetVersion %q, want %q", got.OperatorVersion, got.TargetVersion, v)
			}
			val, set := CRReadyValue(got)
			if set != c.readySet || (set && val != c.readyGaug) {
				t.Errorf("kubevirt_cdi_cr_ready = %v (set %v), want %v (set %v)", val, set, c.readyGaug, c.readySet)
			}
			// Decided again from its own result, nothing changes: a steady state writes nothing.
			again := NextCDIStatus(got, c.obs, metav1.NewTime(now.Add(time.Minute)))
			if again.Phase != got.Phase || len(again.Conditions) != len(got.Conditions) {
				t.Fatalf("not a fixed point: %+v then %+v", got, again)
			}
			for i := range got.Conditions {
				if again.Conditions[i] != got.Conditions[i] {
					t.Errorf("condition %s changed on a second pass: %+v then %+v", got.Conditions[i].Type, got.Conditions[i], again.Conditions[i])
				}
			}
		})
	}
}

func TestNextCDIStatusMessages(t *testing.T) {
	now := metav1.NewTime(time.Unix(2000, 0))
	st := NextCDIStatus(cdiv1.CDIStatus{}, CDIObservation{Version: "v1", Unwanted: true}, now)
	for _, c := range st.Conditions {
		if c.Type == cdiv1.CDIConditionDegraded && c.Message != "Reconciling to error state, unwanted CDI object" {
			t.Errorf("unwanted CDI message %q", c.Message)
		}
	}
	st = NextCDIStatus(cdiv1.CDIStatus{}, CDIObservation{Version: "v1", NotReady: []string{"x"}}, now)
	for _, c := range st.Conditions {
		if c.Type == cdiv1.CDIConditionProgressing && (c.Message != "Started Deployment" || c.LastTransitionTime != now) {
			t.Errorf("deploying condition %+v", c)
		}
	}
	st = NextCDIStatus(st, CDIObservation{Version: "v1"}, now)
	for _, c := range st.Conditions {
		if c.Type == cdiv1.CDIConditionAvailable && c.Message != "Deployment Completed" {
			t.Errorf("deployed condition %+v", c)
		}
	}
	st = NextCDIStatus(st, CDIObservation{Version: "v1", NotReady: []string{"Deployment kubefill-api (0/1 ready)"}}, now)
	for _, c := range st.Conditions {
		if c.Type == cdiv1.CDIConditionDegraded && (c.Status != corev1.ConditionTrue || c.Message != "not ready: Deployment kubefill-api (0/1 ready)") {
			t.Errorf("degraded condition %+v", c)
		}
	}
}

func TestSeedCDIConfig(t *testing.T) {
	gates := cdiv1.CDIConfigSpec{FeatureGates: []string{"HonorWaitForFirstConsumer"}}
	cases := []struct {
		name    string
		cdi     cdiv1.CDI
		configs []cdiv1.CDIConfig
		want    bool
	}{
		{"seeded from the one CDIConfig", cdiv1.CDI{}, []cdiv1.CDIConfig{{Spec: gates}}, true},
		{"an empty CDIConfig spec seeds nothing", cdiv1.CDI{}, []cdiv1.CDIConfig{{}}, false},
		{"no CDIConfig", cdiv1.CDI{}, nil, false},
		{"spec.config already set wins", cdiv1.CDI{Spec: cdiv1.CDISpec{Config: &cdiv1.CDIConfigSpec{}}}, []cdiv1.CDIConfig{{Spec: gates}}, false},
	}
	for _, c := range cases {
		got := SeedCDIConfig(&c.cdi, c.configs)
		if (got != nil) != c.want {
			t.Errorf("%s: got %+v", c.name, got)
		}
		if got != nil && got.FeatureGates[0] != "HonorWaitForFirstConsumer" {
			t.Errorf("%s: seeded %+v", c.name, got)
		}
	}
}
