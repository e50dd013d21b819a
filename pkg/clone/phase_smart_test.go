package clone

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

func TestRefusedCreate(t *testing.T) {
	quota := func(res, name string) error {
		return apierrors.NewForbidden(schema.GroupResource{Resource: res}, name,
			errors.New("exceeded quota: src-storage, requested: requests.storage=2Gi, used: requests.storage=1Gi, limited: requests.storage=2Gi"))
	}
	target := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "dst", Name: "disk", UID: "u1"}}
	restore := types.NamespacedName{Namespace: "src", Name: TmpSourceClaimName("u1")}
	snap := types.NamespacedName{Namespace: "dst", Name: TmpSnapshotName("u1")}
	cases := []struct {
		name    string
		err     error
		what    string
		key     types.NamespacedName
		refused bool
		reason  string
		want    []string
		not     []string
	}{
		{"a quota refuses the restore in the source namespace", quota("persistentvolumeclaims", restore.Name), "PersistentVolumeClaim", restore, true, "ErrExceededQuota",
			[]string{"exceeded quota: src-storage", "the ResourceQuota src-storage in namespace src", "temporary PersistentVolumeClaim tmp-source-pvc-u1",
				"(requested requests.storage=2Gi, used requests.storage=1Gi, limited requests.storage=2Gi)", "next to the clone's source and counts against that namespace's quota",
				"Nothing was created beyond what was asked", "goes on by itself"},
			[]string{"is forbidden"}},
		{"a quota refuses the snapshot in the target's namespace", quota("volumesnapshots", snap.Name), "VolumeSnapshot", snap, true, "ErrExceededQuota",
			[]string{"the ResourceQuota src-storage in namespace dst", "temporary VolumeSnapshot tmp-snapshot-u1 that the clone of disk takes of its source", "counts against the quota with the claim"},
			[]string{"next to the clone's source"}},
		{"a policy refusal is the API's words", apierrors.NewForbidden(schema.GroupResource{Resource: "persistentvolumeclaims"}, restore.Name, errors.New("denied by policy")),
			"PersistentVolumeClaim", restore, true, "ErrExceededQuota", []string{"cannot create the clone's temporary PersistentVolumeClaim src/tmp-source-pvc-u1", "denied by policy"}, nil},
		{"another error is not a wait", errors.New("connection refused"), "VolumeSnapshot", snap, false, "", nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, ok := refusedCreate(c.err, c.what, c.key, target)
			if ok != c.refused {
				t.Fatalf("refusedCreate ok = %v, want %v (%+v)", ok, c.refused, res)
			}
			if !ok {
				return
			}
			if res.Reason != c.reason || res.Event != corev1.EventTypeWarning || res.Done || res.Permanent || res.RetryAfter <= 0 {
				t.Errorf("result %+v: want reason %s, a Warning event, a retried wait", res, c.reason)
			}
			for _, w := range c.want {
				if !strings.Contains(res.Message, w) {
					t.Errorf("message %q lacks %q", res.Message, w)
				}
			}
			for _, w := range c.not {
				if strings.Contains(res.Message, w) {
					t.Errorf("message %q has %q", res.Message, w)
				}
			}
		})
	}
}
