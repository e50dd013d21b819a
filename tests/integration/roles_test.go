package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"
	"github.com/kubefill/kubefill/pkg/cloneauth"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/kit"
)

// startRoleAggregation runs the real kube-controller-manager against the
// shared control plane with only its clusterrole-aggregation controller,
// which folds the rules of ClusterRoles labelled aggregate-to-<role> into the
// built-in admin, edit and view roles. It stops when the test ends.
func startRoleAggregation(t *testing.T) {
	t.Helper()
	assets, err := controlPlaneAssets()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(assets, "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kube-controller-manager is not in %s (hack/testbin.sh builds it): %v", assets, err)
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kcm.kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "admin"}
	kc.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "kube-controller-manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--kubeconfig="+kubeconfig,
		"--controllers=clusterrole-aggregation",
		"--leader-elect=false",
		"--secure-port=0",
		"--v=1",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting kube-controller-manager: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logFile.Name()); err == nil {
				t.Logf("kube-controller-manager log:\n%s", b)
			}
		}
	})
}

// hasRule says whether role grants verb on group/resource through one of its rules.
func hasRule(role *rbacv1.ClusterRole, group, resource, verb string) bool {
	for _, r := range role.Rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) &&
			(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) {
			return true
		}
	}
	return false
}

// asUser is the admin config impersonating an authenticated user.
func asUser(t *testing.T, name string) client.Client {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: name, Groups: []string{"system:authenticated"}}
	cl, err := client.New(c, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// userInfo is the identity asUser impersonates, for SubjectAccessReviews.
func userInfo(name string) authenticationv1.UserInfo {
	return authenticationv1.UserInfo{Username: name, Groups: []string{"system:authenticated"}}
}

// canI asks the real authorizer whether user may do verb on group/resource in ns.
func canI(t *testing.T, user, ns, verb, group, resource, sub string) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: []string{"system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: group, Resource: resource, Subresource: sub},
	}}
	if err := k8sClient.Create(context.Background(), sar); err != nil {
		t.Fatalf("SubjectAccessReview %s %s %s/%s in %s: %v", user, verb, resource, sub, ns, err)
	}
	return sar.Status.Allowed
}

func bindBuiltin(t *testing.T, ns, user, role string) {
	t.Helper()
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user + "-" + role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
	}
	if err := k8sClient.Create(context.Background(), rb); err != nil {
		t.Fatalf("binding %s to %s in %s: %v", user, role, ns, err)
	}
}

// cloneSourcerRole is the non-aggregated role that grants cloning from a
// namespace (manifests/install/aggregated-roles.yaml).
const cloneSourcerRole = "cdi.kubevirt.io:clone-sourcer"

func blankDataVolume(ns, name string) *cdiv1.DataVolume {
	return &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: cdiv1.DataVolumeSpec{
			Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}},
			Storage: &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}},
		},
	}
}

// TestAggregatedRoles installs manifests/install (with aggregated-roles.yaml)
// on the real kube-apiserver (RBAC authorization), runs the real
// clusterrole-aggregation controller, and checks what users bound only to
// the built-in admin, edit and view roles may do.
func TestAggregatedRoles(t *testing.T) {
	applyInstall(t)
	ctx := context.Background()
	startRoleAggregation(t)

	// The aggregation controller folds our rules into the built-in roles.
	for _, c := range []struct{ role, group, resource, verb string }{
		{"admin", cdiv1.GroupName, "datavolumes", "create"},
		{"admin", uploadv1.SchemeGroupVersion.Group, "uploadtokenrequests", "create"},
		{"edit", cdiv1.GroupName, "datavolumes", "create"},
		{"edit", cdiv1.GroupName, "dataimportcrons", "delete"},
		{"edit", uploadv1.SchemeGroupVersion.Group, "uploadtokenrequests", "create"},
		{"edit", cdiv1.GroupName, "datavolumes/source", "create"},
		{"admin", cdiv1.GroupName, "datavolumes/source", "create"},
		{"view", cdiv1.GroupName, "datavolumes", "list"},
		{"view", cdiv1.GroupName, "storageprofiles", "get"},
	} {
		kit.Eventually(t, time.Minute, 200*time.Millisecond, "ClusterRole "+c.role+" aggregates "+c.verb+" "+c.resource, func() (bool, string, error) {
			role := &rbacv1.ClusterRole{}
			if err := k8sClient.Get(ctx, client.ObjectKey{Name: c.role}, role); err != nil {
				return false, "", err
			}
			return hasRule(role, c.group, c.resource, c.verb), "not yet aggregated", nil
		})
	}

	// view no longer carries the clone permission (CDI #4219), and
	// clone-sourcer is aggregated into nothing: it counts only where an
	// admin binds it.
	view := &rbacv1.ClusterRole{}
	if err := k8sClient.Get(ctx, client.ObjectKey{Name: "view"}, view); err != nil {
		t.Fatal(err)
	}
	if hasRule(view, cdiv1.GroupName, "datavolumes/source", "create") {
		t.Errorf("the built-in view role grants create datavolumes/source: a viewer of a namespace could clone its disks")
	}
	for _, name := range []string{"cdi.kubevirt.io:view", cloneSourcerRole} {
		role := &rbacv1.ClusterRole{}
		if err := k8sClient.Get(ctx, client.ObjectKey{Name: name}, role); err != nil {
			t.Fatal(err)
		}
		if name == cloneSourcerRole {
			if !hasRule(role, cdiv1.GroupName, "datavolumes/source", "create") || len(role.Rules) != 1 {
				t.Errorf("%s: rules %+v, want only create datavolumes/source", name, role.Rules)
			}
			for k := range role.Labels {
				if strings.HasPrefix(k, "rbac.authorization.k8s.io/aggregate-to-") {
					t.Errorf("%s is aggregated (label %s)", name, k)
				}
			}
		} else if hasRule(role, cdiv1.GroupName, "datavolumes/source", "create") {
			t.Errorf("%s grants create datavolumes/source", name)
		}
	}

	ns, src := newNamespace(t), newNamespace(t)
	editor, viewer, stranger, sourcer := "kf-editor", "kf-viewer", "kf-stranger", "kf-sourcer"
	bindBuiltin(t, ns, editor, "edit")
	bindBuiltin(t, src, editor, "view")
	bindBuiltin(t, ns, viewer, "view")
	bindBuiltin(t, ns, sourcer, "edit")
	bindBuiltin(t, src, sourcer, cloneSourcerRole)

	// The editor creates a DataVolume, as itself.
	ed := asUser(t, editor)
	if err := ed.Create(ctx, blankDataVolume(ns, "by-editor")); err != nil {
		t.Fatalf("editor creating a DataVolume: %v", err)
	}
	// It may request upload tokens (the aggregated API authorises through a
	// SubjectAccessReview for exactly this) in its namespace, not elsewhere.
	if !canI(t, editor, ns, "create", uploadv1.SchemeGroupVersion.Group, "uploadtokenrequests", "") {
		t.Errorf("editor may not create uploadtokenrequests in %s", ns)
	}
	if canI(t, editor, src, "create", uploadv1.SchemeGroupVersion.Group, "uploadtokenrequests", "") {
		t.Errorf("editor may create uploadtokenrequests in %s, where it is only a viewer", src)
	}
	// Cloning from src: the same check the DataVolume webhook makes. A
	// viewer of src may not (view reads objects, not the disks' bytes), a
	// user bound to clone-sourcer there may, and so may an editor of src.
	authz := cloneauth.Authorizer{Client: k8sClient}
	cloneFrom := cloneauth.Source{Resource: token.ResourcePVC, Namespace: src, Name: "golden"}
	ok, msg, err := authz.Authorize(ctx, userInfo(editor), cloneFrom)
	if err != nil || ok {
		t.Errorf("editor (only view in %s) may clone from it (allowed %v, err %v)", src, ok, err)
	} else if !strings.Contains(msg, "datavolumes/source") || !strings.Contains(msg, src) {
		t.Errorf("refusal message %q does not name datavolumes/source in %s", msg, src)
	}
	ok, msg, err = authz.Authorize(ctx, userInfo(stranger), cloneFrom)
	if err != nil || ok {
		t.Errorf("a user with no role in %s may clone from it (allowed %v, err %v)", src, ok, err)
	} else if !strings.Contains(msg, "datavolumes/source") {
		t.Errorf("refusal message %q does not name datavolumes/source", msg)
	}
	if ok, msg, err = authz.Authorize(ctx, userInfo(sourcer), cloneFrom); err != nil || !ok {
		t.Errorf("a user bound to %s in %s may not clone from it: %v %s", cloneSourcerRole, src, err, msg)
	}
	if !canI(t, sourcer, src, "create", cdiv1.GroupName, "datavolumes", "source") || canI(t, sourcer, src, "get", cdiv1.GroupName, "datavolumes", "") {
		t.Errorf("%s in %s grants more or less than create datavolumes/source", cloneSourcerRole, src)
	}
	srcEditor := "kf-src-editor"
	bindBuiltin(t, src, srcEditor, "edit")
	if ok, msg, err = authz.Authorize(ctx, userInfo(srcEditor), cloneFrom); err != nil || !ok {
		t.Errorf("an editor of %s may not clone from it: %v %s", src, err, msg)
	}

	// The viewer reads but does not write.
	vw := asUser(t, viewer)
	got := &cdiv1.DataVolume{}
	if err := vw.Get(ctx, client.ObjectKey{Namespace: ns, Name: "by-editor"}, got); err != nil {
		t.Errorf("viewer reading a DataVolume: %v", err)
	}
	if err := vw.List(ctx, &cdiv1.DataVolumeList{}, client.InNamespace(ns)); err != nil {
		t.Errorf("viewer listing DataVolumes: %v", err)
	}
	if err := vw.Create(ctx, blankDataVolume(ns, "by-viewer")); !apierrors.IsForbidden(err) {
		t.Errorf("viewer creating a DataVolume: got %v, want Forbidden", err)
	}
	if err := vw.Delete(ctx, got); !apierrors.IsForbidden(err) {
		t.Errorf("viewer deleting a DataVolume: got %v, want Forbidden", err)
	}
	if canI(t, viewer, ns, "create", uploadv1.SchemeGroupVersion.Group, "uploadtokenrequests", "") {
		t.Errorf("viewer may request upload tokens")
	}

	// Anyone authenticated reads the CDIConfig and the StorageProfiles, and nothing else.
	conf := &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: "config"}}
	if err := k8sClient.Create(ctx, conf); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	st := asUser(t, stranger)
	if err := st.Get(ctx, client.ObjectKey{Name: "config"}, &cdiv1.CDIConfig{}); err != nil {
		t.Errorf("an authenticated user reading CDIConfig config: %v", err)
	}
	if err := st.List(ctx, &cdiv1.StorageProfileList{}); err != nil {
		t.Errorf("an authenticated user listing StorageProfiles: %v", err)
	}
	if err := st.List(ctx, &cdiv1.DataVolumeList{}, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
		t.Errorf("an unbound user listing DataVolumes: got %v, want Forbidden", err)
	}
	if err := st.Update(ctx, conf); !apierrors.IsForbidden(err) {
		t.Errorf("an authenticated user updating CDIConfig: got %v, want Forbidden", err)
	}
}
