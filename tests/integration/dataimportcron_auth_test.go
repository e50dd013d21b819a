package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/apiserver/admission"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/kit"
)

const testCloneSourcerRole = "kubefill-test-clone-sourcer"

// grantCloneSource binds ServiceAccount saNS/sa, in namespace ns, to a
// ClusterRole with create on datavolumes/source (what
// cdi.kubevirt.io:clone-sourcer grants) and returns what revokes it.
func grantCloneSource(t *testing.T, c client.Client, ns, saNS, sa string) (revoke func(*testing.T)) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: testCloneSourcerRole},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{cdiv1.GroupName}, Resources: []string{"datavolumes/source"}, Verbs: []string{"create"}}}}
	if err := c.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "clone-sourcer-" + saNS + "-" + sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: testCloneSourcerRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: saNS, Name: sa}},
	}
	if err := c.Create(ctx, rb); err != nil {
		t.Fatal(err)
	}
	return func(t *testing.T) {
		t.Helper()
		if err := c.Delete(ctx, rb); err != nil {
			t.Fatal(err)
		}
	}
}

// registerCronWebhook configures kube-apiserver to call our
// dataimportcron-validate webhook, as CDI's cdi-api-dataimportcron-validate,
// for namespaces labelled label.
func registerCronWebhook(t *testing.T, e *aggEnv, rs *runningServer, label string) {
	t.Helper()
	url := "https://" + rs.addr + admission.PathDataImportCronValidate
	fail, none, timeout := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone, int32(10)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "cdi-api-dataimportcron-validate-" + label},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "dataimportcron-validate.cdi.kubevirt.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: rs.caPEM},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{cdiv1.GroupName}, APIVersions: []string{"v1beta1"}, Resources: []string{"dataimportcrons"}},
			}},
			FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: &timeout,
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{label: "true"}},
		}},
	}
	if err := e.client.Create(context.Background(), vwc); err != nil {
		t.Fatal(err)
	}
}

func pvcCron(ns, name, srcNS, srcName string, sa *string) *cdiv1.DataImportCron {
	return &cdiv1.DataImportCron{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: cdiv1.DataImportCronSpec{
			Schedule: "0 */12 * * *", ManagedDataSource: name + "-ds", ServiceAccountName: sa,
			Template: cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{
				Source:  &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: srcNS, Name: srcName}},
				Storage: &cdiv1.StorageSpec{},
			}},
		},
	}
}

func dvNames(t *testing.T, c client.Client, ns string) []string {
	t.Helper()
	list := &cdiv1.DataVolumeList{}
	if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, dv := range list.Items {
		out = append(out, dv.Name)
	}
	slices.Sort(out)
	return out
}

func progressingOf(c *cdiv1.DataImportCron) cdiv1.DataImportCronCondition {
	for _, cond := range c.Status.Conditions {
		if cond.Type == cdiv1.DataImportCronProgressing {
			return cond
		}
	}
	return cdiv1.DataImportCronCondition{}
}

// TestDataImportCronCloneAuthorization: a DataImportCron with a pvc source
// clones as its ServiceAccount (spec.serviceAccountName, default
// "default"), never as the controller. A cron in A naming a claim of B is
// refused at admission unless that ServiceAccount may clone from B; one
// whose ServiceAccount loses the right later, or that was created where
// the webhooks do not reach, makes no DataVolume and says why, and goes on
// by itself once granted; with the grant it imports, the controller's
// DataVolume carrying a clone token the webhook issued for the
// ServiceAccount. And the DataVolume webhook never authorises a clone for
// the controller itself.
func TestDataImportCronCloneAuthorization(t *testing.T) {
	t.Parallel()
	e := startAggEnv(t)
	rs := e.startServer(t, true)
	ctx := context.Background()
	const label = "kubefill-dic-auth-test"
	registerWebhooks(t, e, rs, label)
	registerCronWebhook(t, e, rs, label)
	a := e.labelledNamespace(t, "tenant-a-", label)
	b := e.labelledNamespace(t, "tenant-b-", label)
	if err := e.client.Create(ctx, newClaim(b, "secret-disk", nil)); err != nil {
		t.Fatal(err)
	}
	// The attacker has what edit in A gives for these kinds, and nothing in B.
	grantRole(t, e, a, "attacker",
		rbacv1.PolicyRule{APIGroups: []string{cdiv1.GroupName}, Resources: []string{"dataimportcrons", "datavolumes"}, Verbs: []string{"*"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods", "persistentvolumeclaims"}, Verbs: []string{"*"}})
	attacker := e.userClient(t, "attacker")

	// Webhooks in effect: only ours refuses a six-field schedule or a bad checksum.
	probes := 0
	kit.Eventually(t, 60*time.Second, kit.Interval, "the webhooks to be in effect", func() (bool, string, error) {
		probes++
		bad := pvcCron(a, fmt.Sprintf("probe-%d", probes), a, "x", nil)
		bad.Spec.Schedule = "0 0 */12 * * *"
		cronErr := e.client.Create(ctx, bad)
		dvErr := e.client.Create(ctx, storageDV(a, fmt.Sprintf("probe-%d", probes), cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://h/d", Checksum: "sha256:nothex"}}))
		return strings.Contains(statusMessage(cronErr), "dataimportcron-validate.cdi.kubevirt.io") && dvErr != nil,
			fmt.Sprintf("cron probe: %v; DataVolume probe: %v", cronErr, dvErr), nil
	})
	if err := e.client.DeleteAllOf(ctx, &cdiv1.DataImportCron{}, client.InNamespace(a)); err != nil {
		t.Fatal(err)
	}

	// The controller, as the identity the webhooks know it by.
	controllerUser := admission.DefaultControllerUser(rs.namespace)
	startCronControllerAs(t, e.userConfig(t, controllerUser, "system:masters"), rs.namespace, false)
	validator := token.NewValidator(token.CloneTokenIssuer, rs.signingKeys(t, e.client).Current, token.DefaultCloneTokenLeeway)
	cronGet := func(ns, name string) func() (*cdiv1.DataImportCron, error) {
		return func() (*cdiv1.DataImportCron, error) {
			c := &cdiv1.DataImportCron{}
			return c, e.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, c)
		}
	}
	describe := func(c *cdiv1.DataImportCron) string {
		return fmt.Sprintf("annotations %v status %+v", c.Annotations, c.Status)
	}
	waitImport := func(t *testing.T, ns, name string) *cdiv1.DataVolume {
		t.Helper()
		return kit.Await(t, 30*time.Second, kit.Interval, "DataVolume "+ns+"/"+name, func() (*cdiv1.DataVolume, error) {
			dv := &cdiv1.DataVolume{}
			err := e.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, dv)
			if apierrors.IsNotFound(err) {
				return nil, nil
			}
			return dv, err
		}, func(dv *cdiv1.DataVolume) bool { return dv != nil }, func(*cdiv1.DataVolume) string {
			return "absent; DataVolumes " + strings.Join(dvNames(t, e.client, ns), ",")
		})
	}
	checkToken := func(t *testing.T, dv *cdiv1.DataVolume, srcNS, srcName string) {
		t.Helper()
		p, err := validator.Validate(dv.Annotations[cdiv1.AnnCloneToken])
		if err != nil {
			t.Fatalf("DataVolume %s/%s: clone token %q: %v", dv.Namespace, dv.Name, dv.Annotations[cdiv1.AnnCloneToken], err)
		}
		if err := token.CheckClone(p, token.ResourcePVC, srcNS, srcName, dv.Namespace, dv.Name); err != nil {
			t.Fatal(err)
		}
	}
	notAuthorized := func(t *testing.T, ns, name, sa string) *cdiv1.DataImportCron {
		t.Helper()
		return kit.Await(t, 30*time.Second, kit.Interval, "DataImportCron "+ns+"/"+name+" to say it is not authorized", cronGet(ns, name), func(c *cdiv1.DataImportCron) bool {
			p := progressingOf(c)
			return p.Status == corev1.ConditionFalse && p.Reason == controller.ReasonNotAuthorized &&
				strings.HasPrefix(p.Message, "Not authorized to create DataVolume: DataImportCron "+ns+"/"+name+" clones "+b+"/secret-disk as ServiceAccount "+ns+"/"+sa) &&
				strings.Contains(p.Message, "create on datavolumes/source") && strings.Contains(p.Message, `in namespace "`+b+`"`)
		}, describe)
	}
	warned := func(t *testing.T, ns, name string) {
		t.Helper()
		kit.Eventually(t, 30*time.Second, kit.Interval, "a Warning NotAuthorized event on "+ns+"/"+name, func() (bool, string, error) {
			ev := kit.Events(e.client, ns, name)
			return strings.Contains(ev, "Warning NotAuthorized") && strings.Contains(ev, "Not authorized to create DataVolume"), ev, nil
		})
	}

	t.Run("a cron whose ServiceAccount may not clone from B is refused at admission", func(t *testing.T) {
		for _, sa := range []*string{nil, ptr.To("importer")} {
			name := "steal-" + ptr.Deref(sa, "default")
			err := attacker.Create(ctx, pvcCron(a, name, b, "secret-disk", sa))
			msg := statusMessage(err)
			if !apierrors.IsForbidden(err) {
				t.Fatalf("serviceAccountName %v: %v; want Forbidden", sa, err)
			}
			for _, w := range []string{`admission webhook "dataimportcron-validate.cdi.kubevirt.io" denied the request`,
				"DataImportCron " + a + "/" + name + " clones " + b + "/secret-disk as ServiceAccount " + a + "/" + ptr.Deref(sa, "default"),
				`user "system:serviceaccount:` + a + ":" + ptr.Deref(sa, "default") + `" may not clone PersistentVolumeClaim`,
				"create on datavolumes/source (API group cdi.kubevirt.io) in namespace \"" + b + "\""} {
				if !strings.Contains(msg, w) {
					t.Errorf("refusal %q does not say %q", msg, w)
				}
			}
		}
		// Only the probes admitted before the webhooks were in effect.
		if got := dvNames(t, e.client, a); slices.ContainsFunc(got, func(n string) bool { return !strings.HasPrefix(n, "probe-") }) {
			t.Errorf("DataVolumes in A: %v", got)
		}
	})

	revoke := grantCloneSource(t, e.client, b, a, "importer")
	src := &corev1.PersistentVolumeClaim{}
	if err := e.client.Get(ctx, types.NamespacedName{Namespace: b, Name: "secret-disk"}, src); err != nil {
		t.Fatal(err)
	}
	first := "golden-ds-" + string(src.UID)[:12]

	t.Run("with a RoleBinding granting the ServiceAccount datavolumes/source in B it imports", func(t *testing.T) {
		if err := attacker.Create(ctx, pvcCron(a, "golden", b, "secret-disk", ptr.To("importer"))); err != nil {
			t.Fatalf("the granted cron was refused: %v", err)
		}
		dv := waitImport(t, a, first)
		checkToken(t, dv, b, "secret-disk")
		// The import succeeds (the test plays the DataVolume controller).
		pvc := kit.PVC(a, first, "1Gi")
		pvc.Labels = dv.Labels
		if err := e.client.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		dv.Status.Phase = cdiv1.Succeeded
		if err := e.client.Status().Update(ctx, dv); err != nil {
			t.Fatal(err)
		}
		kit.Await(t, 30*time.Second, kit.Interval, "the cron up to date", cronGet(a, "golden"), func(c *cdiv1.DataImportCron) bool {
			return len(c.Status.CurrentImports) == 1 && c.Status.CurrentImports[0].DataVolumeName == first && progressingOf(c).Reason == "NoImport"
		}, describe)
	})

	t.Run("a ServiceAccount that loses the right after admission makes no DataVolume, says why, and goes on once granted again", func(t *testing.T) {
		revoke(t)
		// A new version of the source: the claim re-made (new UID), and the poll due.
		old := &corev1.PersistentVolumeClaim{}
		if err := e.client.Get(ctx, types.NamespacedName{Namespace: b, Name: "secret-disk"}, old); err != nil {
			t.Fatal(err)
		}
		if err := e.client.Delete(ctx, old); err != nil {
			t.Fatal(err)
		}
		kit.Eventually(t, 30*time.Second, kit.Interval, "the old source claim to go", func() (bool, string, error) {
			c := &corev1.PersistentVolumeClaim{}
			err := e.client.Get(ctx, client.ObjectKeyFromObject(old), c)
			if apierrors.IsNotFound(err) {
				return true, "", nil
			}
			if err == nil && len(c.Finalizers) > 0 {
				// No controller-manager here to remove pvc-protection.
				c.Finalizers = nil
				return false, "finalizers removed", client.IgnoreNotFound(e.client.Update(ctx, c))
			}
			return false, "still there", client.IgnoreNotFound(err)
		})
		if err := e.client.Create(ctx, newClaim(b, "secret-disk", nil)); err != nil {
			t.Fatal(err)
		}
		fresh := &corev1.PersistentVolumeClaim{}
		if err := e.client.Get(ctx, types.NamespacedName{Namespace: b, Name: "secret-disk"}, fresh); err != nil {
			t.Fatal(err)
		}
		c := &cdiv1.DataImportCron{}
		if err := e.client.Get(ctx, types.NamespacedName{Namespace: a, Name: "golden"}, c); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(c.DeepCopy())
		c.Annotations[cdiv1.AnnNextCronTime] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
		if err := e.client.Patch(ctx, c, patch); err != nil {
			t.Fatal(err)
		}
		c = notAuthorized(t, a, "golden", "importer")
		warned(t, a, "golden")
		if d := c.Annotations[cdiv1.AnnSourceDesiredDigest]; d != "uid:"+string(src.UID) {
			t.Errorf("the refused poll read the claim: digest %q, want the first claim's", d)
		}
		time.Sleep(2 * time.Second) // two retries
		if got := dvNames(t, e.client, a); slices.Contains(got, "golden-ds-"+string(fresh.UID)[:12]) {
			t.Fatalf("an import was made after the right was lost: %v", got)
		}
		// Granted again: the next retry polls and imports, with no one touching the cron.
		grantCloneSource(t, e.client, b, a, "importer")
		dv := waitImport(t, a, "golden-ds-"+string(fresh.UID)[:12])
		checkToken(t, dv, b, "secret-disk")
		kit.Await(t, 30*time.Second, kit.Interval, "Progressing no longer NotAuthorized", cronGet(a, "golden"), func(c *cdiv1.DataImportCron) bool {
			return progressingOf(c).Reason != controller.ReasonNotAuthorized
		}, describe)
	})

	t.Run("a cron created where the webhooks do not reach makes no DataVolume and says why", func(t *testing.T) {
		ns := e.namespace(t, "no-webhooks-")
		grantRole(t, e, ns, "attacker", rbacv1.PolicyRule{APIGroups: []string{cdiv1.GroupName}, Resources: []string{"dataimportcrons"}, Verbs: []string{"*"}})
		if err := attacker.Create(ctx, pvcCron(ns, "steal", b, "secret-disk", nil)); err != nil {
			t.Fatalf("without the webhook: %v", err)
		}
		c := notAuthorized(t, ns, "steal", "default")
		warned(t, ns, "steal")
		if d := c.Annotations[cdiv1.AnnSourceDesiredDigest]; d != "" {
			t.Errorf("B's claim was read for the refused cron: digest %q", d)
		}
		time.Sleep(2 * time.Second)
		if got := dvNames(t, e.client, ns); len(got) != 0 {
			t.Errorf("DataVolumes %v made for the refused cron", got)
		}
		if len(c.Status.CurrentImports) != 0 {
			t.Errorf("currentImports %+v", c.Status.CurrentImports)
		}
	})

	t.Run("the controller's clone DataVolumes are authorised for their cron's ServiceAccount, never for the controller", func(t *testing.T) {
		ctrlClient := e.userClient(t, controllerUser, "system:masters")
		if err := attacker.Create(ctx, registryCron(a, "registry-only", "docker://registry.invalid/os/x:1")); err != nil {
			t.Fatal(err)
		}
		clone := func(name, cron string) *cdiv1.DataVolume {
			dv := storageDV(a, name, cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: b, Name: "secret-disk"}})
			if cron != "" {
				dv.Labels = map[string]string{cdiv1.LabelDataImportCron: cron}
			}
			return dv
		}
		err := ctrlClient.Create(ctx, clone("no-cron", ""))
		if !apierrors.IsForbidden(err) || !strings.Contains(statusMessage(err), "which no DataImportCron accounts for") ||
			!strings.Contains(statusMessage(err), "never on its own authority") {
			t.Errorf("the controller's clone for no cron: %v", err)
		}
		err = ctrlClient.Create(ctx, clone("gone-cron", "gone"))
		if !apierrors.IsForbidden(err) || !strings.Contains(statusMessage(err), "DataImportCron "+a+"/gone, which does not exist") {
			t.Errorf("the controller's clone for a missing cron: %v", err)
		}
		err = ctrlClient.Create(ctx, clone("default-sa", "registry-only"))
		if !apierrors.IsForbidden(err) || !strings.Contains(statusMessage(err), "as ServiceAccount "+a+"/default") ||
			!strings.Contains(statusMessage(err), "create on datavolumes/source") {
			t.Errorf("the controller's clone for a cron whose ServiceAccount may not: %v", err)
		}
		dv := clone("granted-sa", "golden")
		if err := ctrlClient.Create(ctx, dv); err != nil {
			t.Fatalf("the controller's clone for the granted cron: %v", err)
		}
		checkToken(t, dv, b, "secret-disk")
		// A tenant's DataVolume labelled as the granted cron's is still hers.
		err = attacker.Create(ctx, clone("labelled-by-attacker", "golden"))
		if !apierrors.IsForbidden(err) || !strings.Contains(statusMessage(err), `user "attacker" may not clone`) {
			t.Errorf("the attacker's clone labelled as the cron's: %v", err)
		}
	})
}

// TestDataImportCronPollerCredentials: the poller's registry Secret and CA
// come from the cron's namespace, copied into the install namespace under
// poller-<cron UID>; a Secret or ConfigMap of the install namespace is never
// referenced by the name the tenant wrote, even where one of that name exists.
func TestDataImportCronPollerCredentials(t *testing.T) {
	ctx := context.Background()
	installNS, ns := newNamespace(t), newNamespace(t)
	startCronController(t, installNS)
	// What an admin keeps in the install namespace.
	for _, o := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: installNS, Name: "regcreds"},
			Data: map[string][]byte{"accessKeyId": []byte("admin"), "secretKey": []byte("admin-password")}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: installNS, Name: "cdi-uploadserver-signer-bundle"}, Data: map[string]string{"ca-bundle.crt": "upload CA"}},
	} {
		if err := k8sClient.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cron := registryCron(ns, "fedora", "docker://registry.attacker.example:5000/x:latest", func(c *cdiv1.DataImportCron) {
		c.Spec.Template.Spec.Source.Registry.SecretRef = ptr.To("regcreds")
		c.Spec.Template.Spec.Source.Registry.CertConfigMap = ptr.To("cdi-uploadserver-signer-bundle")
		c.Spec.Template.Spec.Storage = &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}}
	})
	createCron(t, cron)
	// No reference to an install-namespace object by the tenant's names, ever.
	neverByTenantsName := func() {
		t.Helper()
		cjs, jobs := &batchv1.CronJobList{}, &batchv1.JobList{}
		if err := k8sClient.List(ctx, cjs, client.InNamespace(installNS)); err != nil {
			t.Fatal(err)
		}
		if err := k8sClient.List(ctx, jobs, client.InNamespace(installNS)); err != nil {
			t.Fatal(err)
		}
		var specs []corev1.PodSpec
		for _, cj := range cjs.Items {
			specs = append(specs, cj.Spec.JobTemplate.Spec.Template.Spec)
		}
		for _, j := range jobs.Items {
			specs = append(specs, j.Spec.Template.Spec)
		}
		for _, ps := range specs {
			for _, c := range ps.Containers {
				for _, e := range c.Env {
					if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && r.SecretKeyRef.Name != controller.PollerCopyName(cron) {
						t.Errorf("the poller references Secret %s/%s", installNS, r.SecretKeyRef.Name)
					}
				}
			}
			for _, v := range ps.Volumes {
				if v.ConfigMap != nil && v.ConfigMap.Name != controller.PollerCopyName(cron) {
					t.Errorf("the poller mounts ConfigMap %s/%s", installNS, v.ConfigMap.Name)
				}
			}
		}
	}

	c := waitCron(t, ns, cron.Name, "Progressing PollerNotStarted naming the missing Secret", func(c *cdiv1.DataImportCron) bool {
		p := progressingOf(c)
		return p.Reason == controller.ReasonPollerNotStarted &&
			strings.Contains(p.Message, "secretRef regcreds: Secret "+ns+"/regcreds does not exist; create it in the DataImportCron's namespace")
	})
	cron.UID = c.UID
	kit.Eventually(t, 30*time.Second, kit.Interval, "a Warning PollerNotStarted event", func() (bool, string, error) {
		ev := kit.Events(k8sClient, ns, cron.Name)
		return strings.Contains(ev, "Warning PollerNotStarted") && strings.Contains(ev, "secretRef regcreds"), ev, nil
	})
	neverByTenantsName()
	cjs := &batchv1.CronJobList{}
	if err := k8sClient.List(ctx, cjs, client.InNamespace(installNS)); err != nil || len(cjs.Items) != 0 {
		t.Errorf("%d poller CronJobs (%v) without the cron's own Secret", len(cjs.Items), err)
	}

	// The tenant's own, in her namespace: copied and used.
	mine := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "regcreds"},
		Data: map[string][]byte{"accessKeyId": []byte("tenant"), "secretKey": []byte("tenant-password")}}
	myCA := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cdi-uploadserver-signer-bundle"}, Data: map[string]string{"ca.crt": "tenant CA"}}
	for _, o := range []client.Object{mine, myCA} {
		if err := k8sClient.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	copyKey := types.NamespacedName{Namespace: installNS, Name: controller.PollerCopyName(cron)}
	if copyKey.Name != "poller-"+string(cron.UID) {
		t.Fatalf("copy name %s", copyKey.Name)
	}
	cj := kit.Await(t, 30*time.Second, kit.Interval, "the poller CronJob", func() (*batchv1.CronJob, error) {
		cj := &batchv1.CronJob{}
		err := k8sClient.Get(ctx, types.NamespacedName{Namespace: installNS, Name: controller.CronJobName(cron)}, cj)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return cj, err
	}, func(cj *batchv1.CronJob) bool { return cj != nil }, func(*batchv1.CronJob) string { return "absent" })
	secretCopy := kit.Await(t, 30*time.Second, kit.Interval, "the Secret copy", func() (*corev1.Secret, error) {
		s := &corev1.Secret{}
		err := k8sClient.Get(ctx, copyKey, s)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return s, err
	}, func(s *corev1.Secret) bool { return s != nil }, func(*corev1.Secret) string { return "absent" })
	if string(secretCopy.Data["secretKey"]) != "tenant-password" || secretCopy.Labels[cdiv1.LabelDataImportCron] != cron.Name ||
		secretCopy.Labels[cdiv1.LabelDataImportCronNs] != ns || len(secretCopy.OwnerReferences) != 1 || secretCopy.OwnerReferences[0].UID != cj.UID {
		t.Errorf("the Secret copy: data %v labels %v owners %+v", secretCopy.Data, secretCopy.Labels, secretCopy.OwnerReferences)
	}
	cmCopy := &corev1.ConfigMap{}
	kit.Eventually(t, 30*time.Second, kit.Interval, "the CA copy", func() (bool, string, error) {
		err := k8sClient.Get(ctx, copyKey, cmCopy)
		return err == nil && cmCopy.Data["ca.crt"] == "tenant CA", fmt.Sprintf("%v %v", cmCopy.Data, err), client.IgnoreNotFound(err)
	})
	kit.Eventually(t, 30*time.Second, kit.Interval, "the initial Job", func() (bool, string, error) {
		err := k8sClient.Get(ctx, types.NamespacedName{Namespace: installNS, Name: controller.InitialJobName(cron)}, &batchv1.Job{})
		return err == nil, fmt.Sprint(err), client.IgnoreNotFound(err)
	})
	neverByTenantsName()

	// Kept in sync with the tenant's Secret.
	mine.Data["secretKey"] = []byte("rotated")
	if err := k8sClient.Update(ctx, mine); err != nil {
		t.Fatal(err)
	}
	kit.Eventually(t, 30*time.Second, kit.Interval, "the copy to follow the source", func() (bool, string, error) {
		s := &corev1.Secret{}
		err := k8sClient.Get(ctx, copyKey, s)
		return err == nil && string(s.Data["secretKey"]) == "rotated", fmt.Sprintf("%q %v", s.Data["secretKey"], err), err
	})

	// Deleted with the poller; the install namespace's own objects stay.
	if err := k8sClient.Delete(ctx, cron); err != nil {
		t.Fatal(err)
	}
	kit.Eventually(t, 30*time.Second, kit.Interval, "the copies to go with the poller", func() (bool, string, error) {
		sErr := k8sClient.Get(ctx, copyKey, &corev1.Secret{})
		cErr := k8sClient.Get(ctx, copyKey, &corev1.ConfigMap{})
		return apierrors.IsNotFound(sErr) && apierrors.IsNotFound(cErr), fmt.Sprintf("Secret: %v, ConfigMap: %v", sErr, cErr), nil
	})
	for _, o := range []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}} {
		name := "regcreds"
		if _, ok := o.(*corev1.ConfigMap); ok {
			name = "cdi-uploadserver-signer-bundle"
		}
		if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: installNS, Name: name}, o); err != nil {
			t.Errorf("the install namespace's %s: %v", name, err)
		}
	}
}

// TestDataImportCronInstallRBAC runs the DataImportCron controller as the
// kubefill-controller ServiceAccount of manifests/install: authorising a pvc
// source for the cron's ServiceAccount (SubjectAccessReviews), and copying a
// poller's registry Secret and CA from the cron's namespace into the install
// namespace and deleting them with the poller, are all allowed.
func TestDataImportCronInstallRBAC(t *testing.T) {
	ctx := context.Background()
	applyInstall(t)
	tenant, src := newNamespace(t), newNamespace(t)
	rec := &forbiddenLog{namespaces: []string{tenant, src, installNamespace}}
	startCronControllerAs(t, impersonating(controllerSA, rec), installNamespace, true)

	if err := k8sClient.Create(ctx, kit.PVC(src, "golden", "64Mi")); err != nil {
		t.Fatal(err)
	}
	grantCloneSource(t, k8sClient, src, tenant, "importer")
	pvc := pvcCron(tenant, "from-pvc", src, "golden", ptr.To("importer"))
	createCron(t, pvc)
	kit.Eventually(t, 30*time.Second, kit.Interval, "the pvc import", func() (bool, string, error) {
		got := dvNames(t, k8sClient, tenant)
		return len(got) == 1 && strings.HasPrefix(got[0], "from-pvc-ds-"), fmt.Sprintf("DataVolumes %v; events:\n%s", got, kit.Events(k8sClient, tenant, "from-pvc")), nil
	})

	for _, o := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "regcreds"}, Data: map[string][]byte{"accessKeyId": []byte("u"), "secretKey": []byte("p")}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "registry-ca"}, Data: map[string]string{"ca.crt": "CA"}},
	} {
		if err := k8sClient.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	reg := registryCron(tenant, "from-registry", "docker://registry.invalid/os/x:1", func(c *cdiv1.DataImportCron) {
		c.Spec.Template.Spec.Source.Registry.SecretRef = ptr.To("regcreds")
		c.Spec.Template.Spec.Source.Registry.CertConfigMap = ptr.To("registry-ca")
	})
	createCron(t, reg)
	key := types.NamespacedName{Namespace: installNamespace, Name: controller.PollerCopyName(reg)}
	kit.Eventually(t, 30*time.Second, kit.Interval, "the poller's copies", func() (bool, string, error) {
		sErr := k8sClient.Get(ctx, key, &corev1.Secret{})
		cErr := k8sClient.Get(ctx, key, &corev1.ConfigMap{})
		return sErr == nil && cErr == nil, fmt.Sprintf("Secret: %v, ConfigMap: %v", sErr, cErr), nil
	})
	if err := k8sClient.Delete(ctx, reg); err != nil {
		t.Fatal(err)
	}
	kit.Eventually(t, 30*time.Second, kit.Interval, "the copies deleted with the poller", func() (bool, string, error) {
		sErr := k8sClient.Get(ctx, key, &corev1.Secret{})
		cErr := k8sClient.Get(ctx, key, &corev1.ConfigMap{})
		return apierrors.IsNotFound(sErr) && apierrors.IsNotFound(cErr), fmt.Sprintf("Secret: %v, ConfigMap: %v", sErr, cErr), nil
	})
	assertNoForbidden(t, "the DataImportCron controller", rec)
}
