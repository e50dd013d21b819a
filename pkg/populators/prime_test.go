package populators

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestParseQuotaExceeded(t *testing.T) {
	pvcs := schema.GroupResource{Resource: "persistentvolumeclaims"}
	// kube-apiserver's words, from its ResourceQuota admission plugin.
	quota := apierrors.NewForbidden(pvcs, "prime-1234", errors.New("exceeded quota: storage, requested: requests.storage=2Gi, used: requests.storage=2Gi, limited: requests.storage=3Gi"))
	q, ok := ParseQuotaExceeded(quota)
	if !ok || *q != (QuotaExceeded{Quota: "storage", Requested: "requests.storage=2Gi", Used: "requests.storage=2Gi", Limited: "requests.storage=3Gi"}) {
		t.Fatalf("%+v %v", q, ok)
	}
	target := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "disk"}}
	prime := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "prime-1234"}}
	msg := q.Explain(prime, target)
	for _, want := range []string{"exceeded quota: storage", "ResourceQuota storage in namespace ns", "prime-1234", "fills disk",
		"requested requests.storage=2Gi, used requests.storage=2Gi, limited requests.storage=3Gi", "counts twice", "Nothing was created"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}
	prime.Namespace = "golden"
	if msg := q.Explain(prime, target); !strings.Contains(msg, "namespace golden") || !strings.Contains(msg, "clone's source") {
		t.Errorf("clone prime: %q", msg)
	}
	for name, err := range map[string]error{
		"policy":    apierrors.NewForbidden(pvcs, "p", errors.New("admission webhook denied the request")),
		"not found": apierrors.NewNotFound(pvcs, "p"),
		"plain":     errors.New("exceeded quota: storage"),
		"nil":       nil,
	} {
		if q, ok := ParseQuotaExceeded(err); ok {
			t.Errorf("%s: parsed %+v", name, q)
		}
	}
}
