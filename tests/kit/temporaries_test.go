package kit

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestTemporaries(t *testing.T) {
	const uid = "1234"
	ev := func(kind, name, objUID string, gone bool) ObjectEvent {
		return ObjectEvent{Kind: kind, Namespace: "ns", Name: name, UID: types.UID(objUID), Gone: gone}
	}
	for _, tc := range []struct {
		name   string
		events []ObjectEvent
		want   []Temporary
	}{
		{"nothing seen", nil, []Temporary{}},
		{"other claims are not counted", []ObjectEvent{ev("claim", "source", "a", false)}, []Temporary{}},
		{"made once, updated, deleted",
			[]ObjectEvent{ev("claim", "prime-1234", "a", false), ev("claim", "prime-1234", "a", false), ev("claim", "prime-1234", "a", true)},
			[]Temporary{{Role: "claim prime-<uid>", Made: 1, MostAtOnce: 1}}},
		{"made again after it went",
			[]ObjectEvent{ev("pod", "importer-prime-1234", "a", false), ev("pod", "importer-prime-1234", "a", true), ev("pod", "importer-prime-1234", "b", false)},
			[]Temporary{{Role: "pod importer-prime-<uid>", Made: 2, MostAtOnce: 1}}},
		{"two at once, roles sorted",
			[]ObjectEvent{ev("snapshot", "tmp-snapshot-1234", "s", false), ev("claim", "tmp-pvc-1234", "a", false), ev("claim", "tmp-pvc-1234", "b", false)},
			[]Temporary{{Role: "claim tmp-pvc-<uid>", Made: 2, MostAtOnce: 2}, {Role: "snapshot tmp-snapshot-<uid>", Made: 1, MostAtOnce: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Temporaries(tc.events, uid); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Temporaries = %+v, want %+v", got, tc.want)
			}
		})
	}
}
