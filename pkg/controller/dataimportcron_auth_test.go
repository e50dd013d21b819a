package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestNotAuthorizedCondition(t *testing.T) {
	c := notAuthorizedCondition("DataImportCron a/x clones b/y as ServiceAccount a/default: it needs create on datavolumes/source")
	if c.Status != corev1.ConditionFalse || c.Reason != "NotAuthorized" ||
		c.Message != "Not authorized to create DataVolume: DataImportCron a/x clones b/y as ServiceAccount a/default: it needs create on datavolumes/source" {
		t.Errorf("%+v", c)
	}
}

func TestRequeueWithin(t *testing.T) {
	for _, c := range []struct{ in, d, want time.Duration }{
		{0, time.Minute, time.Minute},
		{time.Hour, time.Minute, time.Minute},
		{time.Second, time.Minute, time.Second},
	} {
		if got := requeueWithin(ctrl.Result{RequeueAfter: c.in}, c.d).RequeueAfter; got != c.want {
			t.Errorf("requeueWithin(%s, %s) = %s, want %s", c.in, c.d, got, c.want)
		}
	}
}

// cronFixture runs the DataImportCron reconciler on a fake API whose
// SubjectAccessReviews allow what allow says.
type cronFixture struct {
	t      *testing.T
	c      client.Client
	r      *DataImportCronReconciler
	events *events.FakeRecorder
	allow  func(user string, at authorizationv1.ResourceAttributes) bool
	sars   int
}

func newCronFixture(t *testing.T, objs ...client.Object) *cronFixture {
	f := &cronFixture{t: t, allow: func(string, authorizationv1.ResourceAttributes) bool { return false }}
	uids := 0
	f.c = fake.NewClientBuilder().WithScheme(NewScheme()).WithObjects(objs...).WithStatusSubresource(&cdiv1.DataImportCron{}).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if sar, ok := obj.(*authorizationv1.SubjectAccessReview); ok {
				f.sars++
				sar.Status.Allowed = f.allow(sar.Spec.User, *sar.Spec.ResourceAttributes)
				return nil
			}
			if obj.GetUID() == "" {
				uids++
				obj.SetUID(types.UID("00000000-0000-0000-0000-00000000000" + string(rune('0'+uids))))
			}
			return c.Create(ctx, obj, opts...)
		}}).Build()
	f.events = events.NewFakeRecorder(100)
	f.r = &DataImportCronReconciler{Client: f.c, Reader: f.c, Recorder: f.events, Namespace: "kubefill-system", Image: "kubefill/kubefill:test",
		NotAuthorizedRetry: 3 * time.Second, PollerCopyResync: 5 * time.Second}
	return f
}

func (f *cronFixture) reconcile(ns, name string) ctrl.Result {
	f.t.Helper()
	res, err := f.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}})
	if err != nil {
		f.t.Fatalf("Reconcile: %v", err)
	}
	return res
}

func (f *cronFixture) cron(ns, name string) *cdiv1.DataImportCron {
	f.t.Helper()
	c := &cdiv1.DataImportCron{}
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, c); err != nil {
		f.t.Fatal(err)
	}
	return c
}

func (f *cronFixture) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-f.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func progressing(c *cdiv1.DataImportCron) cdiv1.DataImportCronCondition {
	if p := findCronCondition(c, cdiv1.DataImportCronProgressing); p != nil {
		return *p
	}
	return cdiv1.DataImportCronCondition{}
}

// A pvc source in another namespace that the cron's ServiceAccount may not
// clone: the claim is not read (no digest), no DataVolume is made, the cron
// says why once, and a later grant lets it go on at the next retry.
func TestDataImportCronNotAuthorized(t *testing.T) {
	src := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "secret-disk", UID: "6f1c2a3e-8b7d-4c2e-9f00-123456789abc"}}
	cron := &cdiv1.DataImportCron{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "steal", UID: "c0ffee00-0000-0000-0000-000000000000"},
		Spec: cdiv1.DataImportCronSpec{Schedule: "*/30 * * * *", ManagedDataSource: "steal-ds",
			Template: cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "b", Name: "secret-disk"}},
				Storage: &cdiv1.StorageSpec{}}}},
	}
	f := newCronFixture(t, src, cron)
	res := f.reconcile("a", "steal")
	c := f.cron("a", "steal")
	if d := c.Annotations[cdiv1.AnnSourceDesiredDigest]; d != "" {
		t.Errorf("the claim of b was read for a refused cron: digest %q", d)
	}
	p := progressing(c)
	for _, w := range []string{"Not authorized to create DataVolume: DataImportCron a/steal clones b/secret-disk as ServiceAccount a/default",
		"create on datavolumes/source", `in namespace "b"`} {
		if !strings.Contains(p.Message, w) {
			t.Errorf("Progressing message %q does not say %q", p.Message, w)
		}
	}
	if p.Status != corev1.ConditionFalse || p.Reason != ReasonNotAuthorized {
		t.Errorf("Progressing %+v, want False/NotAuthorized", p)
	}
	if res.RequeueAfter != 3*time.Second {
		t.Errorf("requeue after %s, want the 3s retry", res.RequeueAfter)
	}
	ev := f.drainEvents()
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning NotAuthorized Not authorized to create DataVolume: DataImportCron a/steal") {
		t.Errorf("events %q, want one Warning NotAuthorized", ev)
	}
	// A tenant's hand-set digest does not get an import made either.
	c.Annotations[cdiv1.AnnSourceDesiredDigest] = "uid:" + string(src.UID)
	if err := f.c.Update(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	f.reconcile("a", "steal")
	if dvs := (&cdiv1.DataVolumeList{}); f.c.List(context.Background(), dvs) != nil || len(dvs.Items) != 0 {
		t.Errorf("DataVolumes %+v made for a refused cron", dvs.Items)
	}
	if c := f.cron("a", "steal"); len(c.Status.CurrentImports) != 0 {
		t.Errorf("currentImports %+v without a DataVolume", c.Status.CurrentImports)
	}
	if ev := f.drainEvents(); len(ev) != 0 {
		t.Errorf("the same refusal again made events %q", ev)
	}

	// Granted: the next pass polls and imports.
	f.allow = func(u string, at authorizationv1.ResourceAttributes) bool {
		return u == "system:serviceaccount:a:default" && at.Namespace == "b" && at.Subresource == "source" && at.Name == "secret-disk"
	}
	c = f.cron("a", "steal")
	delete(c.Annotations, cdiv1.AnnSourceDesiredDigest)
	if err := f.c.Update(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	f.reconcile("a", "steal")
	f.reconcile("a", "steal")
	c = f.cron("a", "steal")
	if d := c.Annotations[cdiv1.AnnSourceDesiredDigest]; d != "uid:"+string(src.UID) {
		t.Errorf("digest %q after the grant", d)
	}
	dv := &cdiv1.DataVolume{}
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: "a", Name: "steal-ds-6f1c2a3e-8b7"}, dv); err != nil {
		t.Fatalf("the import after the grant: %v", err)
	}
	if p := progressing(c); p.Reason == ReasonNotAuthorized {
		t.Errorf("still %+v after the grant", p)
	}
}

func registryCronWithRefs(secret, cm string) *cdiv1.DataImportCron {
	url := "docker://registry.a.svc:5000/os/fedora:40"
	reg := &cdiv1.DataVolumeSourceRegistry{URL: &url}
	if secret != "" {
		reg.SecretRef = &secret
	}
	if cm != "" {
		reg.CertConfigMap = &cm
	}
	return &cdiv1.DataImportCron{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "fedora", UID: "0d1e2f30-4a5b-6c7d-8e9f-a0b1c2d3e4f5"},
		Spec: cdiv1.DataImportCronSpec{Schedule: "0 */12 * * *", ManagedDataSource: "fedora",
			Template: cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Registry: reg}, Storage: &cdiv1.StorageSpec{}}}},
	}
}

// The poller's registry Secret and CA come from the cron's namespace, as
// copies in the install namespace; the install namespace's objects of the
// names the cron gives are never used.
func TestDataImportCronPollerCopies(t *testing.T) {
	ctx := context.Background()
	admins := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kubefill-system", Name: "regcreds"},
		Data: map[string][]byte{"accessKeyId": []byte("admin"), "secretKey": []byte("admin-password")}}
	adminCA := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kubefill-system", Name: "registry-ca"}, Data: map[string]string{"ca.crt": "admin CA"}}
	cron := registryCronWithRefs("regcreds", "registry-ca")
	f := newCronFixture(t, admins, adminCA, cron)

	// Not in the cron's namespace: no poller, and the cron says why.
	res := f.reconcile("a", "fedora")
	cjs := &batchv1.CronJobList{}
	if err := f.c.List(ctx, cjs); err != nil || len(cjs.Items) != 0 {
		t.Fatalf("CronJobs %d (%v) without the cron's Secret", len(cjs.Items), err)
	}
	p := progressing(f.cron("a", "fedora"))
	if p.Reason != ReasonPollerNotStarted || !strings.Contains(p.Message, "secretRef regcreds: Secret a/regcreds does not exist; create it in the DataImportCron's namespace") {
		t.Errorf("Progressing %+v", p)
	}
	if ev := f.drainEvents(); len(ev) != 1 || !strings.Contains(ev[0], "Warning PollerNotStarted the poller cannot start: secretRef regcreds") {
		t.Errorf("events %q", ev)
	}
	if res.RequeueAfter != 5*time.Second {
		t.Errorf("requeue after %s, want the 5s resync", res.RequeueAfter)
	}

	// The tenant's own: copied, labelled, owned by the CronJob, and used.
	mine := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "regcreds"},
		Data: map[string][]byte{"accessKeyId": []byte("tenant"), "secretKey": []byte("tenant-password"), "other": []byte("not copied")}}
	myCA := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "registry-ca"}, Data: map[string]string{"ca.crt": "tenant CA"}}
	for _, o := range []client.Object{mine, myCA} {
		if err := f.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	f.reconcile("a", "fedora")
	copyName := "poller-" + string(cron.UID)
	cj := &batchv1.CronJob{}
	if err := f.c.Get(ctx, types.NamespacedName{Namespace: "kubefill-system", Name: CronJobName(cron)}, cj); err != nil {
		t.Fatal(err)
	}
	for _, ps := range []corev1.PodSpec{cj.Spec.JobTemplate.Spec.Template.Spec, initialJob(t, f, cron).Spec.Template.Spec} {
		secrets, cms := podTemplateReferences(&ps)
		if len(secrets) != 1 || secrets[0] != copyName || len(cms) != 1 || cms[0] != copyName {
			t.Errorf("the poller uses Secrets %v and ConfigMaps %v, want only the copies %s", secrets, cms, copyName)
		}
	}
	s := &corev1.Secret{}
	if err := f.c.Get(ctx, types.NamespacedName{Namespace: "kubefill-system", Name: copyName}, s); err != nil {
		t.Fatal(err)
	}
	if string(s.Data["accessKeyId"]) != "tenant" || string(s.Data["secretKey"]) != "tenant-password" || len(s.Data) != 2 {
		t.Errorf("the Secret copy holds %v", s.Data)
	}
	if !isPollerCopyOf(s, "a", "fedora") || len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != cj.UID {
		t.Errorf("the Secret copy's labels %v owners %+v", s.Labels, s.OwnerReferences)
	}
	cm := &corev1.ConfigMap{}
	if err := f.c.Get(ctx, types.NamespacedName{Namespace: "kubefill-system", Name: copyName}, cm); err != nil || cm.Data["ca.crt"] != "tenant CA" {
		t.Errorf("the CA copy %v (%v)", cm.Data, err)
	}
	if p := progressing(f.cron("a", "fedora")); p.Reason == ReasonPollerNotStarted {
		t.Errorf("still %+v", p)
	}

	// Kept in sync with the source.
	mine.Data["secretKey"] = []byte("rotated")
	if err := f.c.Update(ctx, mine); err != nil {
		t.Fatal(err)
	}
	if res := f.reconcile("a", "fedora"); res.RequeueAfter != 5*time.Second {
		t.Errorf("requeue after %s, want the 5s resync", res.RequeueAfter)
	}
	if err := f.c.Get(ctx, types.NamespacedName{Namespace: "kubefill-system", Name: copyName}, s); err != nil || string(s.Data["secretKey"]) != "rotated" {
		t.Errorf("after the source changed the copy holds %v (%v)", s.Data, err)
	}

	// The source gone: the copy goes too.
	if err := f.c.Delete(ctx, mine); err != nil {
		t.Fatal(err)
	}
	f.reconcile("a", "fedora")
	if err := f.c.Get(ctx, types.NamespacedName{Namespace: "kubefill-system", Name: copyName}, &corev1.Secret{}); err == nil {
		t.Error("the Secret copy outlived its source")
	}
	if err := f.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "regcreds"},
		Data: map[string][]byte{"accessKeyId": []byte("tenant"), "secretKey": []byte("again")}}); err != nil {
		t.Fatal(err)
	}
	f.reconcile("a", "fedora")

	// The cron deleted: the copies go with the poller; the admin's objects stay.
	if err := f.c.Delete(ctx, f.cron("a", "fedora")); err != nil {
		t.Fatal(err)
	}
	f.reconcile("a", "fedora")
	for _, o := range []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}} {
		if err := f.c.Get(ctx, types.NamespacedName{Namespace: "kubefill-system", Name: copyName}, o); err == nil {
			t.Errorf("%T copy left after the cron was deleted", o)
		}
	}
	for _, o := range []client.Object{admins, adminCA} {
		if err := f.c.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			t.Errorf("the install namespace's %s: %v", o.GetName(), err)
		}
	}
}

func initialJob(t *testing.T, f *cronFixture, cron *cdiv1.DataImportCron) *batchv1.Job {
	t.Helper()
	job := &batchv1.Job{}
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: "kubefill-system", Name: InitialJobName(cron)}, job); err != nil {
		t.Fatal(err)
	}
	return job
}

// A Secret without the keys the poller reads is named as the problem.
func TestPollerSecretData(t *testing.T) {
	cron := registryCronWithRefs("regcreds", "")
	data, problem := pollerSecretData(cron, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcreds"}, Data: map[string][]byte{"accessKeyId": []byte("u")}})
	if data != nil || problem != `secretRef regcreds: Secret a/regcreds has no key "secretKey"; the poller needs "accessKeyId" and "secretKey" (the registry's user name and password)` {
		t.Errorf("%v %q", data, problem)
	}
	data, problem = pollerSecretData(cron, &corev1.Secret{Data: map[string][]byte{"accessKeyId": []byte("u"), "secretKey": []byte("p"), ".dockerconfigjson": []byte("{}")}})
	if problem != "" || len(data) != 2 || string(data["secretKey"]) != "p" {
		t.Errorf("%v %q", data, problem)
	}
}

// Only the cron's own copies are ever deleted.
func TestIsPollerCopyOf(t *testing.T) {
	cron := registryCronWithRefs("", "")
	mine := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Labels: pollerCopyLabels(cron)}}
	if !isPollerCopyOf(mine, "a", "fedora") {
		t.Error("the cron's copy not recognised")
	}
	for name, l := range map[string]map[string]string{
		"unlabelled":           nil,
		"another cron's":       {cdiv1.LabelDataImportCron: "centos", cdiv1.LabelDataImportCronNs: "a", cdiv1.LabelAppManagedBy: "kubefill", cdiv1.LabelAppComponent: "poller"},
		"another namespace's":  {cdiv1.LabelDataImportCron: "fedora", cdiv1.LabelDataImportCronNs: "b", cdiv1.LabelAppManagedBy: "kubefill", cdiv1.LabelAppComponent: "poller"},
		"not Kubefill's":       {cdiv1.LabelDataImportCron: "fedora", cdiv1.LabelDataImportCronNs: "a"},
		"another component's ": {cdiv1.LabelDataImportCron: "fedora", cdiv1.LabelDataImportCronNs: "a", cdiv1.LabelAppManagedBy: "kubefill", cdiv1.LabelAppComponent: "storage"},
	} {
		if isPollerCopyOf(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Labels: l}}, "a", "fedora") {
			t.Errorf("%s object taken for the cron's copy", name)
		}
	}
}

// The poller's pod uses the copies' names, never the cron's.
func TestPollerPodSpecUsesCopies(t *testing.T) {
	cron := registryCronWithRefs("regcreds", "registry-ca")
	ps := pollerPodSpec(cron, pollerSpec{Secret: "poller-x", CertConfigMap: "poller-x"}).Spec
	secrets, cms := podTemplateReferences(&ps)
	if len(secrets) != 1 || secrets[0] != "poller-x" || len(cms) != 1 || cms[0] != "poller-x" {
		t.Errorf("secrets %v configMaps %v", secrets, cms)
	}
	if c := ps.Containers[0].Command; c[len(c)-2] != "-certdir" {
		t.Errorf("command %v without -certdir", c)
	}
	ps = pollerPodSpec(cron, pollerSpec{}).Spec
	if secrets, cms := podTemplateReferences(&ps); len(secrets)+len(cms) != 0 || len(ps.Volumes) != 0 {
		t.Errorf("without copies the pod still references %v %v", secrets, cms)
	}
	if got := PollerCopyName(cron); got != "poller-0d1e2f30-4a5b-6c7d-8e9f-a0b1c2d3e4f5" {
		t.Errorf("PollerCopyName %q", got)
	}
}
