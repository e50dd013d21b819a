package populators

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// crossTarget is claim a/x whose dataSourceRef names VolumeImportSource
// sourceNS/src.
func crossTarget(sourceNS string) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "x"}}
	pvc.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeImportSourceRef, Name: "src"}
	if sourceNS != "" {
		pvc.Spec.DataSourceRef.Namespace = ptr.To(sourceNS)
	}
	return pvc
}

type grantPeer map[string]any

// grant builds a ReferenceGrant as kube-apiserver lists it.
func grant(apiVersion, ns string, from, to []grantPeer) unstructured.Unstructured {
	spec := map[string]any{}
	var f, t []any
	for _, p := range from {
		f = append(f, map[string]any(p))
	}
	for _, p := range to {
		t = append(t, map[string]any(p))
	}
	spec["from"], spec["to"] = f, t
	return unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion,
		"kind":       "ReferenceGrant",
		"metadata":   map[string]any{"name": "g", "namespace": ns},
		"spec":       spec,
	}}
}

var (
	fromA     = []grantPeer{{"group": "", "kind": "PersistentVolumeClaim", "namespace": "a"}}
	toSrc     = []grantPeer{{"group": cdiv1.GroupName, "kind": cdiv1.VolumeImportSourceRef, "name": "src"}}
	toAllKind = []grantPeer{{"group": cdiv1.GroupName, "kind": cdiv1.VolumeImportSourceRef}}
)

func TestGrantAllows(t *testing.T) {
	const v1beta1, v1 = "gateway.networking.k8s.io/v1beta1", "gateway.networking.k8s.io/v1"
	for _, tc := range []struct {
		name   string
		target *corev1.PersistentVolumeClaim
		grants []unstructured.Unstructured
		want   bool
	}{
		{"same namespace needs no grant", crossTarget("a"), nil, true},
		{"no namespace on the ref needs no grant", crossTarget(""), nil, true},
		{"no grant", crossTarget("b"), nil, false},
		{"allowed by name (v1beta1)", crossTarget("b"), []unstructured.Unstructured{grant(v1beta1, "b", fromA, toSrc)}, true},
		{"allowed by name (v1)", crossTarget("b"), []unstructured.Unstructured{grant(v1, "b", fromA, toSrc)}, true},
		{"an unknown version allows nothing", crossTarget("b"), []unstructured.Unstructured{grant("gateway.networking.k8s.io/v9", "b", fromA, toSrc)}, false},
		{"another group's ReferenceGrant allows nothing", crossTarget("b"), []unstructured.Unstructured{grant("example.com/v1beta1", "b", fromA, toSrc)}, false},
		{"name empty allows every source of the kind", crossTarget("b"), []unstructured.Unstructured{grant(v1beta1, "b", fromA, toAllKind)}, true},
		{"name given as empty string allows every source of the kind", crossTarget("b"), []unstructured.Unstructured{grant(v1beta1, "b", fromA,
			[]grantPeer{{"group": cdiv1.GroupName, "kind": cdiv1.VolumeImportSourceRef, "name": ""}})}, true},
		{"name set and different", crossTarget("b"), []unstructured.Unstructured{grant(v1beta1, "b", fromA,
			[]grantPeer{{"group": cdiv1.GroupName, "kind": cdiv1.VolumeImportSourceRef, "name": "other"}})}, false},
		{"wrong from-namespace", crossTarget("b"), []unstructured.Unstructured{grant(v1beta1, "b",
			[]grantPeer{{"group": "", "kind": "PersistentVolumeClaim", "namespace": "c"}}, toSrc)}, false},
		{"wrong from-kind", crossTarget("b"), []unstructured.Unstructured{grant(v1beta1, "b",
			[]grantPeer{{"group": "", "kind": "Pod", "namespace": "a"}}, toSrc)}, false},
		{"wrong from-group", crossTarget("b"), []unstructured.Unstructured{grant(v1beta1, "b",
			[]grantPeer{{"group": "core", "kind": "PersistentVolumeClaim", "namespace": "a"}}, toSrc)}, false},
		{"wrong to-kind", crossTarget("b"), []unstructured.Unstructured{grant(v1beta1, "b", fromA,
			[]grantPeer{{"group": cdiv1.GroupName, "kind": cdiv1.VolumeUploadSourceRef, "name": "src"}})}, false},
		{"wrong to-group", crossTarget("b"), []unstructured.Unstructured{grant(v1beta1, "b", fromA,
			[]grantPeer{{"group": "", "kind": cdiv1.VolumeImportSourceRef, "name": "src"}})}, false},
		{"grant in the claim's namespace does not count", crossTarget("b"), []unstructured.Unstructured{grant(v1beta1, "a", fromA, toSrc)}, false},
		{"grant in a third namespace does not count", crossTarget("b"), []unstructured.Unstructured{grant(v1beta1, "c", fromA, toSrc)}, false},
		{"from and to must be in the same grant", crossTarget("b"), []unstructured.Unstructured{
			grant(v1beta1, "b", fromA, []grantPeer{{"group": cdiv1.GroupName, "kind": cdiv1.VolumeImportSourceRef, "name": "other"}}),
			grant(v1beta1, "b", []grantPeer{{"group": "", "kind": "PersistentVolumeClaim", "namespace": "c"}}, toSrc),
		}, false},
		{"one matching grant among others", crossTarget("b"), []unstructured.Unstructured{
			grant(v1beta1, "b", []grantPeer{{"group": "", "kind": "PersistentVolumeClaim", "namespace": "c"}}, toSrc),
			grant(v1, "b", append([]grantPeer{{"group": "", "kind": "PersistentVolumeClaim", "namespace": "c"}}, fromA...),
				append([]grantPeer{{"group": cdiv1.GroupName, "kind": cdiv1.VolumeUploadSourceRef}}, toSrc...)),
		}, true},
		{"a grant without a spec allows nothing", crossTarget("b"), []unstructured.Unstructured{{Object: map[string]any{
			"apiVersion": v1beta1, "kind": "ReferenceGrant", "metadata": map[string]any{"name": "g", "namespace": "b"},
		}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := GrantAllows(tc.target, tc.grants); got != tc.want {
				t.Errorf("GrantAllows = %v, want %v", got, tc.want)
			}
		})
	}
}

// grantReader serves ReferenceGrant lists by version; a version not in
// served is not served (no match).
type grantReader struct {
	served map[string][]unstructured.Unstructured
	err    error
	lists  []string // "version namespace" of each List call
}

func (r *grantReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("not used")
}

func (r *grantReader) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	u := list.(*unstructured.UnstructuredList)
	gvk := u.GroupVersionKind()
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	r.lists = append(r.lists, gvk.Version+" "+lo.Namespace)
	if r.err != nil {
		return r.err
	}
	items, ok := r.served[gvk.Version]
	if !ok {
		return &meta.NoKindMatchError{GroupKind: gvk.GroupKind(), SearchedVersions: []string{gvk.Version}}
	}
	for _, it := range items {
		if it.GetNamespace() == lo.Namespace {
			u.Items = append(u.Items, it)
		}
	}
	return nil
}

func TestGrantCheckerAllowed(t *testing.T) {
	ctx := context.Background()
	const v1beta1, v1 = "gateway.networking.k8s.io/v1beta1", "gateway.networking.k8s.io/v1"
	notFound := apierrors.NewNotFound(schema.GroupResource{Group: ReferenceGrantGroup, Resource: "referencegrants"}, "")
	for _, tc := range []struct {
		name        string
		target      *corev1.PersistentVolumeClaim
		reader      *grantReader
		want        bool
		wantMessage []string // substrings
		wantErr     bool
		wantLists   []string
	}{
		{name: "same namespace reads nothing", target: crossTarget("a"), reader: &grantReader{}, want: true},
		{name: "no namespace on the ref reads nothing", target: crossTarget(""), reader: &grantReader{}, want: true},
		{name: "allowed by a v1beta1 grant", target: crossTarget("b"),
			reader: &grantReader{served: map[string][]unstructured.Unstructured{"v1beta1": {grant(v1beta1, "b", fromA, toSrc)}, "v1": nil}},
			want:   true, wantLists: []string{"v1beta1 b"}},
		{name: "only v1 served", target: crossTarget("b"),
			reader: &grantReader{served: map[string][]unstructured.Unstructured{"v1": {grant(v1, "b", fromA, toSrc)}}},
			want:   true, wantLists: []string{"v1beta1 b", "v1 b"}},
		{name: "a grant in another namespace is not listed", target: crossTarget("b"),
			reader: &grantReader{served: map[string][]unstructured.Unstructured{"v1beta1": {grant(v1beta1, "a", fromA, toSrc)}}},
			wantMessage: []string{
				"PersistentVolumeClaim a/x may not use VolumeImportSource b/src",
				"no ReferenceGrant in namespace b allows PersistentVolumeClaims from namespace a",
				"gateway.networking.k8s.io/v1beta1", "kind: PersistentVolumeClaim, namespace: a", `group: "cdi.kubevirt.io", kind: VolumeImportSource, name: src`,
			},
			wantLists: []string{"v1beta1 b"}},
		{name: "CRD not installed", target: crossTarget("b"), reader: &grantReader{},
			wantMessage: []string{"PersistentVolumeClaim a/x may not use VolumeImportSource b/src", "ReferenceGrant CRD", "not installed", "cross-namespace sources are refused"},
			wantLists:   []string{"v1beta1 b", "v1 b"}},
		{name: "CRD removed (NotFound)", target: crossTarget("b"), reader: &grantReader{err: notFound},
			wantMessage: []string{"not installed"}, wantLists: []string{"v1beta1 b", "v1 b"}},
		{name: "other errors are returned", target: crossTarget("b"),
			reader:  &grantReader{err: apierrors.NewForbidden(schema.GroupResource{Group: ReferenceGrantGroup, Resource: "referencegrants"}, "", errors.New("no"))},
			wantErr: true, wantLists: []string{"v1beta1 b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &GrantChecker{Reader: tc.reader}
			got, msg, err := g.Allowed(ctx, tc.target)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("allowed = %v, want %v (message %q)", got, tc.want, msg)
			}
			if got && msg != "" {
				t.Errorf("allowed with a message %q", msg)
			}
			for _, want := range tc.wantMessage {
				if !strings.Contains(msg, want) {
					t.Errorf("message %q lacks %q", msg, want)
				}
			}
			if strings.Join(tc.reader.lists, ",") != strings.Join(tc.wantLists, ",") {
				t.Errorf("lists %v, want %v", tc.reader.lists, tc.wantLists)
			}
		})
	}
	// A checker without a reader fails cross-namespace claims, never allows them.
	var nilChecker *GrantChecker
	if ok, _, err := nilChecker.Allowed(ctx, crossTarget("b")); ok || err == nil {
		t.Errorf("nil checker: allowed %v, err %v", ok, err)
	}
	if ok, _, err := nilChecker.Allowed(ctx, crossTarget("a")); !ok || err != nil {
		t.Errorf("nil checker, same namespace: allowed %v, err %v", ok, err)
	}
}
