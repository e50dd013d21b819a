package kit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// Terminal reports whether a DataVolume or pod phase is final: Succeeded or
// Failed.
func Terminal[P cdiv1.DataVolumePhase | corev1.PodPhase](phase P) bool {
	switch any(phase) {
	case cdiv1.Succeeded, cdiv1.Failed, corev1.PodSucceeded, corev1.PodFailed:
		return true
	}
	return false
}

// DataVolumeInterval is how often WaitDataVolume polls.
const DataVolumeInterval = 250 * time.Millisecond

// WaitDataVolume polls a DataVolume until done says so, recording every
// phase and progress it passes through, and returns it and those steps. On
// timeout the test fails with the steps, the last status and the events of
// the DataVolume and its claim.
func WaitDataVolume(t testing.TB, c client.Client, ns, name string, timeout time.Duration, done func(*cdiv1.DataVolume) bool) (*cdiv1.DataVolume, []string) {
	t.Helper()
	var seen []string
	dv := &cdiv1.DataVolume{}
	wait(t, timeout, DataVolumeInterval, "DataVolume "+ns+"/"+name, func() (bool, string, error) {
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, dv); err != nil {
			return false, "", err
		}
		step := fmt.Sprintf("%s %s", dv.Status.Phase, dv.Status.Progress)
		if len(seen) == 0 || seen[len(seen)-1] != step {
			seen = append(seen, step)
		}
		return done(dv), "", nil
	}, func() string {
		return fmt.Sprintf("passed through %v\nstatus: %+v\nevents of the DataVolume and its claim:\n%s", seen, dv.Status, Events(c, ns, name))
	})
	return dv, seen
}

// WaitDataVolumeTerminal waits until a DataVolume is Succeeded or Failed.
func WaitDataVolumeTerminal(t testing.TB, c client.Client, ns, name string, timeout time.Duration) (*cdiv1.DataVolume, []string) {
	t.Helper()
	return WaitDataVolume(t, c, ns, name, timeout, func(dv *cdiv1.DataVolume) bool { return Terminal(dv.Status.Phase) })
}

// DataVolumeCondition returns the DataVolume's condition of type typ, or
// the zero condition.
func DataVolumeCondition(dv *cdiv1.DataVolume, typ cdiv1.DataVolumeConditionType) cdiv1.DataVolumeCondition {
	for _, c := range dv.Status.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return cdiv1.DataVolumeCondition{}
}

// Events lists a namespace's events about objects named name, one a line,
// for failure messages.
func Events(c client.Client, ns, name string) string {
	var list corev1.EventList
	err := c.List(context.Background(), &list, client.InNamespace(ns),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.name", name)})
	if err != nil {
		return fmt.Sprintf("(list events: %v)", err)
	}
	return FormatEvents(list.Items)
}

// FormatEvents renders events one a line: type, reason, source, message.
func FormatEvents(events []corev1.Event) string {
	var b strings.Builder
	for _, e := range events {
		fmt.Fprintf(&b, "  %s %s %s: %s\n", e.Type, e.Reason, e.Source.Component, e.Message)
	}
	return b.String()
}
