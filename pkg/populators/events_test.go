package populators

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ev(name string, at time.Time) corev1.Event {
	return corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: name}, LastTimestamp: metav1.NewTime(at)}
}

func TestEventsToCopy(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	names := func(es []corev1.Event) string {
		var s []string
		for _, e := range es {
			s = append(s, e.Name)
		}
		return strings.Join(s, ",")
	}
	many := make([]corev1.Event, 60)
	for i := range many {
		many[i] = ev(fmt.Sprintf("e%02d", i), t0.Add(time.Duration(i)*time.Second))
	}
	misbound := ev("m", t0.Add(time.Second))
	misbound.Reason = "ClaimMisbound"
	for _, tc := range []struct {
		name       string
		events     []corev1.Event
		copied     string
		wantCopy   string
		wantCopied string
	}{
		{"none", nil, "", "", ""},
		{"all new, oldest first", []corev1.Event{ev("b", t0.Add(time.Second)), ev("a", t0)}, "", "a,b", "b,a"},
		{"already copied are skipped", []corev1.Event{ev("a", t0), ev("b", t0.Add(time.Second))}, "a", "b", "a,b"},
		{"nothing new", []corev1.Event{ev("a", t0)}, "a", "", "a"},
		{"the rebind's ClaimMisbound is not the target's", []corev1.Event{ev("a", t0), misbound}, "", "a", "a"},
		{"the new API's eventTime counts", []corev1.Event{
			{ObjectMeta: metav1.ObjectMeta{Name: "new"}, EventTime: metav1.NewMicroTime(t0.Add(-time.Minute))}, ev("old", t0)}, "", "new,old", "new,old"},
		{"the list stays bounded", many, "", names(many), strings.Split(names(many), ",")[10] + "," + strings.Join(strings.Split(names(many), ",")[11:], ",")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, copied := EventsToCopy(tc.events, tc.copied)
			if names(got) != tc.wantCopy || copied != tc.wantCopied {
				t.Errorf("EventsToCopy = %q, %q; want %q, %q", names(got), copied, tc.wantCopy, tc.wantCopied)
			}
		})
	}
}
