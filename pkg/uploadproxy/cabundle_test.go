package uploadproxy

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The upload-server bundle read through the API: fetched, cached for a
// second, followed when it changes, kept when the ConfigMap goes away.
func TestConfigMapBundle(t *testing.T) {
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "bundle"}, Data: map[string]string{"ca-bundle.crt": "one"}}
	kube := fake.NewClientset(cm)
	b := &configMapBundle{client: kube, namespace: "ns", name: "bundle", log: logr.Discard()}
	if got := string(b.get(ctx)); got != "one" {
		t.Fatalf("first read %q", got)
	}
	cm.Data["ca-bundle.crt"] = "two"
	if _, err := kube.CoreV1().ConfigMaps("ns").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := string(b.get(ctx)); got != "one" {
		t.Errorf("read within a second of the last: %q, want the cached one", got)
	}
	b.fetched = time.Now().Add(-2 * time.Second)
	if got := string(b.get(ctx)); got != "two" {
		t.Errorf("read after a second: %q, want the new bundle", got)
	}
	if err := kube.CoreV1().ConfigMaps("ns").Delete(ctx, "bundle", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	b.fetched = time.Now().Add(-2 * time.Second)
	if got := string(b.get(ctx)); got != "two" {
		t.Errorf("read after the ConfigMap is gone: %q, want the last bundle kept", got)
	}
}
