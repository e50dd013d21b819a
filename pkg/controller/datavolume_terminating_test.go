package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// What kube-apiserver answers a create in a namespace being deleted.
func namespaceTerminatingError(ns string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: "unable to create new content in namespace " + ns + " because it is being terminated",
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause, Field: "metadata.namespace"}}},
	}}
}

// A DataVolume whose namespace is being deleted cannot get its claim; that
// is the namespace going away, not an error to retry and log.
func TestReconcileIgnoresTerminatingNamespace(t *testing.T) {
	dv := &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "disk", Namespace: "leaving", UID: "uid-1"},
		Spec:       cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, PVC: &corev1.PersistentVolumeClaimSpec{}},
	}
	creates := 0
	c := fake.NewClientBuilder().WithScheme(NewScheme()).WithObjects(dv).WithStatusSubresource(dv).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
			creates++
			return namespaceTerminatingError("leaving")
		}}).Build()
	r := &DataVolumeReconciler{Client: c, Recorder: events.NewFakeRecorder(10)}
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "leaving", Name: "disk"}})
	if err != nil || res != (ctrl.Result{}) {
		t.Fatalf("Reconcile = %+v, %v; want nothing to do", res, err)
	}
	if creates == 0 {
		t.Fatal("the reconciler never tried to create anything; the test proves nothing")
	}
	// Other refusals still surface.
	c2 := fake.NewClientBuilder().WithScheme(NewScheme()).WithObjects(dv).WithStatusSubresource(dv).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
			return apierrors.NewForbidden(cdiv1.Resource("volumeimportsources"), "x", nil)
		}}).Build()
	r2 := &DataVolumeReconciler{Client: c2, Recorder: events.NewFakeRecorder(10)}
	if _, err := r2.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "leaving", Name: "disk"}}); err == nil {
		t.Fatal("a plain Forbidden was swallowed")
	}
}
