package admission

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/token"
)

const controllerUser = "system:serviceaccount:kubefill-system:kubefill-controller"

// After admission, the short token never changes and the extended token
// changes only by the controller's hand.
func TestValidateCloneTokenUpdate(t *testing.T) {
	with := func(ann map[string]string) *cdiv1.DataVolume {
		return &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "d", Annotations: ann}}
	}
	short, ext := cdiv1.AnnCloneToken, cdiv1.AnnExtendedCloneToken
	admitted := map[string]string{short: "webhook-token", "team": "x"}
	extended := map[string]string{short: "webhook-token", ext: "controller-token"}
	for _, c := range []struct {
		name     string
		old, new map[string]string
		user     string
		refused  []string // the annotation keys named in the refusal
	}{
		{"unchanged, by a user", admitted, map[string]string{short: "webhook-token", "team": "y"}, "alice", nil},
		{"short token replaced", admitted, map[string]string{short: "forged", "team": "x"}, "alice", []string{short}},
		{"short token added to a DataVolume that had none", map[string]string{}, map[string]string{short: "forged"}, "alice", []string{short}},
		{"short token emptied", admitted, map[string]string{short: "", "team": "x"}, "alice", []string{short}},
		{"short token removed", admitted, map[string]string{"team": "x"}, "alice", []string{short}},
		{"short token replaced by the controller", admitted, map[string]string{short: "other"}, controllerUser, []string{short}},
		{"extended token added by the controller", admitted, extended, controllerUser, nil},
		{"extended token replaced by the controller", extended, map[string]string{short: "webhook-token", ext: "re-minted"}, controllerUser, nil},
		{"extended token added by a user", admitted, extended, "alice", []string{ext}},
		{"extended token removed by a user", extended, admitted, "alice", []string{ext}},
		{"extended token kept by a user", extended, map[string]string{short: "webhook-token", ext: "controller-token", "l": "v"}, "alice", nil},
		{"both planted by a user", map[string]string{}, extended, "alice", []string{short, ext}},
	} {
		t.Run(c.name, func(t *testing.T) {
			errs := ValidateCloneTokenUpdate(with(c.new), with(c.old), c.user, controllerUser)
			if len(errs) != len(c.refused) {
				t.Fatalf("errors %v, want refusals of %v", errs, c.refused)
			}
			for i, key := range c.refused {
				if want := "metadata.annotations[" + key + "]"; errs[i].Field != want {
					t.Errorf("refusal %d names %s, want %s", i, errs[i].Field, want)
				}
			}
		})
	}
	// Without a controller identity configured nobody may touch the extended token.
	if errs := ValidateCloneTokenUpdate(with(extended), with(admitted), "", ""); len(errs) != 1 {
		t.Errorf("no controller user: %v", errs)
	}
}

// The refusal says what was refused, why, and what to do instead.
func TestDataVolumeValidatorRefusesTokenEdits(t *testing.T) {
	v := &DataVolumeValidator{ControllerUser: controllerUser}
	old := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "disk", Annotations: map[string]string{cdiv1.AnnCloneToken: "webhook-token"}},
		Spec: baseSpec(cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "src", Name: "golden"}})}
	edited := old.DeepCopy()
	edited.Annotations[cdiv1.AnnCloneToken] = "forged"
	edited.Annotations[cdiv1.AnnExtendedCloneToken] = "forged-too"
	req := review("DataVolume", admissionv1.Update, edited, old)
	req.UserInfo = authenticationv1.UserInfo{Username: "mallory"}
	r := v.Admit(context.Background(), req)
	if r.Allowed {
		t.Fatal("token edit allowed")
	}
	for _, want := range []string{cdiv1.AnnCloneToken, "set once, by the DataVolume webhook", "create a new DataVolume",
		cdiv1.AnnExtendedCloneToken, controllerUser, `user "mallory" may not`} {
		if !strings.Contains(r.Result.Message, want) {
			t.Errorf("message %q lacks %q", r.Result.Message, want)
		}
	}
	// The controller adding the extended token is allowed.
	minted := old.DeepCopy()
	minted.Annotations[cdiv1.AnnExtendedCloneToken] = "controller-token"
	req = review("DataVolume", admissionv1.Update, minted, old)
	req.UserInfo = authenticationv1.UserInfo{Username: controllerUser}
	if r := v.Admit(context.Background(), req); !r.Allowed {
		t.Fatalf("controller's extended token refused: %+v", r.Result)
	}
}

// Whatever clone tokens a request brings are removed, or replaced.
func TestAnnotationPatchStripsTokens(t *testing.T) {
	both := map[string]string{cdiv1.AnnCloneToken: "forged", cdiv1.AnnExtendedCloneToken: "forged", "keep": "me"}
	for _, c := range []struct {
		name    string
		current map[string]string
		set     map[string]string
		want    string
	}{
		{"non-clone with both tokens", both, nil,
			`[{"op":"remove","path":"/metadata/annotations/cdi.kubevirt.io~1storage.clone.token"},{"op":"remove","path":"/metadata/annotations/cdi.kubevirt.io~1storage.extended.clone.token"}]`},
		{"clone with both tokens", both, map[string]string{cdiv1.AnnCloneToken: "ours"},
			`[{"op":"remove","path":"/metadata/annotations/cdi.kubevirt.io~1storage.extended.clone.token"},{"op":"add","path":"/metadata/annotations/cdi.kubevirt.io~1storage.clone.token","value":"ours"}]`},
		{"clone without annotations", nil, map[string]string{cdiv1.AnnCloneToken: "ours"},
			`[{"op":"add","path":"/metadata/annotations","value":{"cdi.kubevirt.io/storage.clone.token":"ours"}}]`},
		{"nothing to do", map[string]string{"keep": "me"}, nil, `null`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, _ := json.Marshal(annotationPatch(c.current, c.set, strippedTokens(c.current)))
			if string(got) != c.want {
				t.Errorf("patch %s\nwant  %s", got, c.want)
			}
		})
	}
	// The mutator's answer for a non-clone that brings an extended token.
	m := &DataVolumeMutator{}
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "d", Annotations: map[string]string{cdiv1.AnnExtendedCloneToken: "copied"}},
		Spec: baseSpec(cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}})}
	r := m.Admit(context.Background(), review("DataVolume", admissionv1.Create, dv, nil))
	if !r.Allowed || !strings.Contains(string(r.Patch), `"op":"remove","path":"/metadata/annotations/cdi.kubevirt.io~1storage.extended.clone.token"`) {
		t.Fatalf("extended token on a non-clone: %+v %s", r, r.Patch)
	}
}

// sarAllowing is a client holding objs whose SubjectAccessReviews allow
// the users named.
func sarAllowing(t *testing.T, objs []client.Object, users ...string) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := cdiv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if sar, ok := obj.(*authorizationv1.SubjectAccessReview); ok {
				sar.Status.Allowed = slices.Contains(users, sar.Spec.User)
				return nil
			}
			return c.Create(ctx, obj, opts...)
		}}).Build()
}

// The token the mutator mints records who asked, is CDI-shaped (issuer,
// params), and replaces whatever the request brought.
func TestDataVolumeMutatorRecordsTheRequester(t *testing.T) {
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	m := &DataVolumeMutator{Client: sarAllowing(t, nil, "alice"), Tokens: token.NewGenerator(token.CloneTokenIssuer, key, token.DefaultCloneTokenLifetime)}
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "x",
		Annotations: map[string]string{cdiv1.AnnCloneToken: "forged", cdiv1.AnnExtendedCloneToken: "forged"}},
		Spec: baseSpec(cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "src", Name: "golden"}})}
	req := review("DataVolume", admissionv1.Create, dv, nil)
	req.UserInfo = authenticationv1.UserInfo{Username: "alice", UID: "u-1", Groups: []string{"devs", "system:authenticated"},
		Extra: map[string]authenticationv1.ExtraValue{"scopes": {"a"}}}
	r := m.Admit(context.Background(), req)
	if !r.Allowed {
		t.Fatalf("alice refused: %+v", r.Result)
	}
	var ops []patchOp
	if err := json.Unmarshal(r.Patch, &ops); err != nil {
		t.Fatal(err)
	}
	if len(ops) != 2 || ops[0].Op != "remove" || !strings.HasSuffix(ops[0].Path, "storage.extended.clone.token") || ops[1].Op != "add" {
		t.Fatalf("patch %s", r.Patch)
	}
	tok, _ := ops[1].Value.(string)
	p, err := token.NewValidator(token.CloneTokenIssuer, &key.PublicKey, 0).Validate(tok)
	if err != nil {
		t.Fatal(err)
	}
	if err := token.CheckClone(p, token.ResourcePVC, "src", "golden", "team", "x"); err != nil {
		t.Error(err)
	}
	if p.Requester == nil || p.Requester.Username != "alice" || p.Requester.UID != "u-1" || !slices.Equal(p.Requester.Groups, req.UserInfo.Groups) ||
		!slices.Equal(p.Requester.Extra["scopes"], []string{"a"}) {
		t.Errorf("requester %+v, want alice's identity", p.Requester)
	}
	// Bob may not: refused, no token.
	req.UserInfo = authenticationv1.UserInfo{Username: "bob"}
	if r := m.Admit(context.Background(), req); r.Allowed || r.Patch != nil || !strings.Contains(r.Result.Message, `user "bob" may not clone`) {
		t.Fatalf("bob: %+v", r)
	}
}

// A DataImportCron's import, asked for by the controller, is authorised
// for the cron's ServiceAccount, and its token records that ServiceAccount
// (with its groups), not the controller: a re-check is made for it.
func TestDataVolumeMutatorRecordsTheCronServiceAccount(t *testing.T) {
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	cron := &cdiv1.DataImportCron{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "nightly"}, Spec: cdiv1.DataImportCronSpec{ServiceAccountName: ptr("importer")}}
	sa := "system:serviceaccount:team:importer"
	m := &DataVolumeMutator{Client: sarAllowing(t, []client.Object{cron}, sa), Tokens: token.NewGenerator(token.CloneTokenIssuer, key, time.Minute), ControllerUser: controllerUser}
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "x", Labels: map[string]string{cdiv1.LabelDataImportCron: "nightly"}},
		Spec: baseSpec(cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "src", Name: "golden"}})}
	req := review("DataVolume", admissionv1.Create, dv, nil)
	req.UserInfo = authenticationv1.UserInfo{Username: controllerUser, Groups: []string{"system:serviceaccounts"}}
	r := m.Admit(context.Background(), req)
	if !r.Allowed {
		t.Fatalf("the cron's import refused: %+v", r.Result)
	}
	var ops []patchOp
	if err := json.Unmarshal(r.Patch, &ops); err != nil || len(ops) != 1 {
		t.Fatalf("patch %s (%v)", r.Patch, err)
	}
	v, _ := ops[0].Value.(map[string]any)
	tok, _ := v[cdiv1.AnnCloneToken].(string)
	p, err := token.NewValidator(token.CloneTokenIssuer, &key.PublicKey, 0).Validate(tok)
	if err != nil {
		t.Fatal(err)
	}
	if p.Requester == nil || p.Requester.Username != sa || !slices.Contains(p.Requester.Groups, "system:serviceaccounts:team") {
		t.Errorf("requester %+v, want ServiceAccount team/importer with its groups", p.Requester)
	}
}
