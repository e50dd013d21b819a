package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/cloneauth"
	"github.com/kubefill/kubefill/pkg/token"
)

// fakeAuthorizer allows user/namespace/name pairs it lists, and records
// what it was asked.
type fakeAuthorizer struct {
	allow map[string]bool
	asked []string
}

func (a *fakeAuthorizer) Authorize(_ context.Context, user authenticationv1.UserInfo, src cloneauth.Source) (bool, string, error) {
	key := user.Username + "@" + src.Namespace + "/" + src.Name
	a.asked = append(a.asked, key)
	if a.allow[key] {
		return true, "", nil
	}
	return false, fmt.Sprintf("user %q may not clone PersistentVolumeClaim %s/%s: it needs create on datavolumes/source (API group cdi.kubevirt.io) in namespace %q, or create pods there",
		user.Username, src.Namespace, src.Name, src.Namespace), nil
}

func (f *cloneFixture) shortTokenFor(p *token.Payload) string {
	f.t.Helper()
	s, err := token.NewGenerator(token.CloneTokenIssuer, f.key, token.DefaultCloneTokenLifetime).Generate(p)
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func (f *cloneFixture) pointDataSource(ns, name, pvcNS, pvcName string) {
	f.t.Helper()
	ds := &cdiv1.DataSource{}
	if !f.get(ns, name, ds) {
		f.t.Fatalf("no DataSource %s/%s", ns, name)
	}
	ds.Spec.Source = cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: pvcNS, Name: pvcName}}
	if err := f.c.Update(context.Background(), ds); err != nil {
		f.t.Fatal(err)
	}
}

func sourceRefDV(ns, name, dsNS, dsName string, ann map[string]string) *cdiv1.DataVolume {
	dv := cloneDV(ns, name, "", "", ann)
	dv.Spec.Source, dv.Spec.SourceRef = nil, &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Namespace: ptr.To(dsNS), Name: dsName}
	return dv
}

// A DataSource re-pointed after admission: the clone goes on only from a
// source the user the token records may clone, asked again; it waits,
// saying which permission is missing, for one she may not; once the claim
// exists the clone stays on the source it started from.
func TestCloneSourceRefRepointedIsAuthorisedAgain(t *testing.T) {
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: "src", Name: "ds"},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "src", Name: "golden"}}}}
	f := newCloneFixture(t, ds, sourceClaim("src", "golden", "1Gi"), sourceClaim("src", "other", "1Gi"), sourceClaim("secrets", "disk", "1Gi"))
	authz := &fakeAuthorizer{allow: map[string]bool{"alice@src/other": true}}
	f.r.Authorizer = authz
	ctx := context.Background()
	alice := token.RequesterOf(authenticationv1.UserInfo{Username: "alice", Groups: []string{"devs"}})
	short := f.shortTokenFor(token.WithRequester(token.NewClonePayload(token.ResourcePVC, "src", "golden", "tgt", "disk"), alice))
	if err := f.c.Create(ctx, sourceRefDV("tgt", "disk", "src", "ds", map[string]string{cdiv1.AnnCloneToken: short})); err != nil {
		t.Fatal(err)
	}
	// At once, the extended token, with the requester, before the source is looked at.
	f.reconcile("tgt", "disk")
	p, err := f.r.ExtendedTokenValidator.Validate(f.dv("tgt", "disk").Annotations[cdiv1.AnnExtendedCloneToken])
	if err != nil {
		t.Fatal(err)
	}
	if p.Requester == nil || p.Requester.Username != "alice" || p.Name != "golden" || p.Params[token.ParamUID] != "dv-disk" {
		t.Fatalf("extended payload %+v, requester %+v", p, p.Requester)
	}

	// Re-pointed at a claim alice may not clone: refused, nothing made there.
	f.pointDataSource("src", "ds", "secrets", "disk")
	res := f.reconcile("tgt", "disk")
	dv := f.dv("tgt", "disk")
	run := f.running(dv)
	for _, want := range []string{"DataSource src/ds (spec.sourceRef) now resolves to PersistentVolumeClaim secrets/disk",
		"not to PersistentVolumeClaim src/golden", `user "alice" may not clone`, "datavolumes/source", `namespace "secrets"`} {
		if !strings.Contains(run.Message, want) {
			t.Errorf("Running %q lacks %q", run.Message, want)
		}
	}
	if run.Reason != reasonSourceNotAuthorized || res.RequeueAfter != notAuthorizedRetry {
		t.Errorf("Running reason %q, requeue %s", run.Reason, res.RequeueAfter)
	}
	if !f.sawEvent("Warning " + reasonSourceNotAuthorized) {
		t.Error("no Warning event")
	}
	if f.get("tgt", "disk", &corev1.PersistentVolumeClaim{}) || f.get("secrets", "volume-clone-source-dv-disk", &cdiv1.VolumeCloneSource{}) {
		t.Fatal("a claim or a VolumeCloneSource was made for a source nobody authorised")
	}
	if got, _ := f.r.ExtendedTokenValidator.Validate(dv.Annotations[cdiv1.AnnExtendedCloneToken]); got == nil || got.Name != "golden" {
		t.Errorf("the extended token changed: %+v", got)
	}

	// Re-pointed at one she may clone: a new extended token naming it, for her; the clone goes on.
	f.pointDataSource("src", "ds", "src", "other")
	f.reconcile("tgt", "disk")
	dv = f.dv("tgt", "disk")
	p, err = f.r.ExtendedTokenValidator.Validate(dv.Annotations[cdiv1.AnnExtendedCloneToken])
	if err != nil || token.CheckExtendedClone(p, token.ResourcePVC, "src", "other", "tgt", "disk", "dv-disk") != nil || p.Requester.Username != "alice" {
		t.Fatalf("re-authorised token %+v (%v)", p, err)
	}
	if !f.sawEvent("Normal " + reasonCloneReauthorized) {
		t.Error("no Normal event saying the new source was authorised")
	}
	f.reconcile("tgt", "disk")
	f.reconcile("tgt", "disk")
	vcs := &cdiv1.VolumeCloneSource{}
	if !f.get("src", "volume-clone-source-dv-disk", vcs) || vcs.Spec.Source.Name != "other" {
		t.Fatalf("VolumeCloneSource %+v", vcs.Spec)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if !f.get("tgt", "disk", pvc) {
		t.Fatalf("no claim: %+v", f.running(f.dv("tgt", "disk")))
	}

	// Started: a re-point now changes nothing, asks nobody, and makes nothing elsewhere.
	asked := len(authz.asked)
	f.pointDataSource("src", "ds", "secrets", "disk")
	f.reconcile("tgt", "disk")
	if !f.get("src", "volume-clone-source-dv-disk", vcs) || vcs.Spec.Source.Name != "other" || f.get("secrets", "volume-clone-source-dv-disk", &cdiv1.VolumeCloneSource{}) {
		t.Errorf("the started clone moved: %+v", vcs.Spec)
	}
	if len(authz.asked) != asked {
		t.Errorf("asked again once started: %v", authz.asked[asked:])
	}
	if run := f.running(f.dv("tgt", "disk")); strings.Contains(run.Message, "secrets") {
		t.Errorf("Running names the DataSource's new source: %q", run.Message)
	}
}

// A token from before requesters were recorded cannot be re-checked.
func TestCloneSourceRefRepointedWithoutRequester(t *testing.T) {
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: "src", Name: "ds"},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "src", Name: "other"}}}}
	f := newCloneFixture(t, ds, sourceClaim("src", "other", "1Gi"))
	f.r.Authorizer = &fakeAuthorizer{}
	short := f.shortToken("src", "golden", "tgt", "disk", time.Now())
	if err := f.c.Create(context.Background(), sourceRefDV("tgt", "disk", "src", "ds", map[string]string{cdiv1.AnnCloneToken: short})); err != nil {
		t.Fatal(err)
	}
	f.reconcile("tgt", "disk")
	f.reconcile("tgt", "disk")
	if run := f.running(f.dv("tgt", "disk")); !strings.Contains(run.Message, "records no user to authorise again") || !strings.Contains(run.Message, "delete and re-create") {
		t.Errorf("Running %q", run.Message)
	}
}

// Within one namespace no token is needed, but one present is held to.
func TestCloneSameNamespaceSourceRefRepointed(t *testing.T) {
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: "tgt", Name: "ds"},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "tgt", Name: "private"}}}}
	f := newCloneFixture(t, ds, sourceClaim("tgt", "private", "1Gi"), sourceClaim("tgt", "golden", "1Gi"))
	f.r.Authorizer = &fakeAuthorizer{}
	bob := token.RequesterOf(authenticationv1.UserInfo{Username: "bob"})
	short := f.shortTokenFor(token.WithRequester(token.NewClonePayload(token.ResourcePVC, "tgt", "golden", "tgt", "disk"), bob))
	if err := f.c.Create(context.Background(), sourceRefDV("tgt", "disk", "tgt", "ds", map[string]string{cdiv1.AnnCloneToken: short})); err != nil {
		t.Fatal(err)
	}
	f.reconcile("tgt", "disk")
	f.reconcile("tgt", "disk")
	if run := f.running(f.dv("tgt", "disk")); run.Reason != reasonSourceNotAuthorized || !strings.Contains(run.Message, `user "bob" may not clone PersistentVolumeClaim tgt/private`) {
		t.Errorf("Running %+v", run)
	}
	if f.get("tgt", "disk", &corev1.PersistentVolumeClaim{}) {
		t.Error("claim made")
	}
	// Without a token (no webhook), a same-namespace clone goes on as before.
	if err := f.c.Create(context.Background(), sourceRefDV("tgt", "plain", "tgt", "ds", nil)); err != nil {
		t.Fatal(err)
	}
	f.reconcile("tgt", "plain")
	if !f.get("tgt", "plain", &corev1.PersistentVolumeClaim{}) {
		t.Errorf("token-less same-namespace clone: %+v", f.running(f.dv("tgt", "plain")))
	}
}

func TestGrantCovers(t *testing.T) {
	dv := sourceRefDV("tgt", "disk", "src", "ds", nil)
	alice := token.RequesterOf(authenticationv1.UserInfo{Username: "alice"})
	pvc := token.WithRequester(token.NewClonePayload(token.ResourcePVC, "src", "golden", "tgt", "disk"), alice)
	dsTok := token.WithRequester(token.NewClonePayload(token.ResourceDataSource, "src", "ds", "tgt", "disk"), alice)
	for _, c := range []struct {
		name  string
		grant *token.Payload
		src   CloneSource
		ok    bool
	}{
		{"the named claim", pvc, CloneSource{Namespace: "src", Name: "golden"}, true},
		{"another claim", pvc, CloneSource{Namespace: "src", Name: "other"}, false},
		{"a snapshot of that name", pvc, CloneSource{Snapshot: true, Namespace: "src", Name: "golden"}, false},
		{"DataSource token, in its namespace", dsTok, CloneSource{Namespace: "src", Name: "anything"}, true},
		{"DataSource token, elsewhere", dsTok, CloneSource{Namespace: "secrets", Name: "disk"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := grantCovers(c.grant, dv, c.src)
			if (err == nil) != c.ok {
				t.Fatalf("err %v, want ok=%v", err, c.ok)
			}
			if c.ok && (p.Requester == nil || p.Requester.Username != "alice" || p.Name != c.src.Name) {
				t.Errorf("payload %+v keeps no requester or names another source", p)
			}
		})
	}
	for _, c := range []struct {
		name  string
		p     *token.Payload
		bound bool
		ok    bool
	}{
		{"this DataVolume", pvc, false, true},
		{"another target", token.NewClonePayload(token.ResourcePVC, "src", "golden", "tgt", "other"), false, false},
		{"an upload token", token.NewUploadPayload("tgt", "disk"), false, false},
		{"unbound, where bound is needed", pvc, true, false},
		{"bound to this DataVolume", token.WithUID(pvc, "dv-disk"), true, true},
		{"bound to another", token.WithUID(pvc, "dv-other"), true, false},
	} {
		if err := checkTokenTarget(c.p, dv, c.bound); (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok=%v", c.name, err, c.ok)
		}
	}
}
