package installed

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/kit"
)

// The tenancy suite (issue 24) attacks the install as a tenant who holds
// only namespace-scoped rights: the built-in edit role in namespace A (and,
// where a route needs it, view in B), through impersonation. Every test
// writes a random marker into a claim of B, as B's owner (the admin, by a
// pod), tries one route, and asserts both that the attempt is refused with a
// message naming what is missing and that the marker is in no claim of A
// (for the routes that write, that A's marker is in no claim of B). The
// authorised paths run the same way and must carry the marker across.

const (
	// tenancyWait bounds how long a test waits for a flow (a clone, an
	// import) to end, or for a refusal to show.
	tenancyWait = 4 * time.Minute
	// markedMiB is the size of the disk.img a marked claim holds.
	markedMiB = 8
	// claimSize is the size of every claim the tests make.
	claimSize = "64Mi"
	// cloneSourcerRole is the non-aggregated role that grants cloning from
	// a namespace (manifests/install/aggregated-roles.yaml).
	cloneSourcerRole = "cdi.kubevirt.io:clone-sourcer"
	// apiService is the install's Service in front of the webhooks and the
	// aggregated API (manifests/install/apiserver.yaml).
	apiService = "kubefill-api"
)

// tenant is a user who holds only the RoleBindings a test gives it.
type tenant struct {
	name string
	c    client.WithWatch
}

// newTenant is a fresh user, impersonated (as every authenticated user, it
// is in group system:authenticated and nothing else).
func newTenant(t *testing.T) *tenant {
	t.Helper()
	name := "tenant-" + randomSuffix()
	cfg := rest.CopyConfig(cl.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: name, Groups: []string{"system:authenticated"}}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return &tenant{name: name, c: c}
}

func (u *tenant) subject() rbacv1.Subject {
	return rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: u.name}
}

func (u *tenant) info() authenticationv1.UserInfo {
	return authenticationv1.UserInfo{Username: u.name, Groups: []string{"system:authenticated"}}
}

func serviceAccountSubject(ns, name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}
}

func serviceAccountInfo(ns, name string) authenticationv1.UserInfo {
	return authenticationv1.UserInfo{Username: "system:serviceaccount:" + ns + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
}

// tenancyNamespaces are a test's own A (the attacker's) and B (the
// victim's), deleted after it.
func tenancyNamespaces(t *testing.T) (a, b string) {
	t.Helper()
	return testNamespace(t, "tenancy-a"), testNamespace(t, "tenancy-b")
}

// bind binds ClusterRole role to subject in ns, as the namespace's admin
// would, and waits until the authorizer says so (the RBAC cache follows
// within a moment). The binding goes with the namespace.
func bind(t *testing.T, ns, role string, subject rbacv1.Subject, who authenticationv1.UserInfo) *rbacv1.RoleBinding {
	t.Helper()
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: strings.ReplaceAll(role, ":", "-") + "-" + randomSuffix()},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{subject},
	}
	if err := kc.Create(context.Background(), rb); err != nil {
		t.Fatalf("binding %s to %s in %s: %v", subject.Name, role, ns, err)
	}
	probe := map[string]authorizationv1.ResourceAttributes{
		"edit":           {Namespace: ns, Verb: "create", Group: cdiv1.GroupName, Resource: "datavolumes"},
		"view":           {Namespace: ns, Verb: "list", Group: cdiv1.GroupName, Resource: "datavolumes"},
		cloneSourcerRole: {Namespace: ns, Verb: "create", Group: cdiv1.GroupName, Resource: "datavolumes", Subresource: cdiv1.DataVolumeCloneSourceSubresource},
	}[role]
	if probe.Verb != "" {
		waitAllowed(t, who, probe, true)
	}
	return rb
}

// unbind deletes a RoleBinding and waits until the authorizer no longer
// allows what it granted.
func unbind(t *testing.T, rb *rbacv1.RoleBinding, who authenticationv1.UserInfo, probe authorizationv1.ResourceAttributes) {
	t.Helper()
	if err := kc.Delete(context.Background(), rb); err != nil {
		t.Fatal(err)
	}
	waitAllowed(t, who, probe, false)
}

// allowed asks the real authorizer.
func allowed(who authenticationv1.UserInfo, attrs authorizationv1.ResourceAttributes) (bool, error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: who.Username, Groups: who.Groups, ResourceAttributes: &attrs}}
	if err := kc.Create(context.Background(), sar); err != nil {
		return false, err
	}
	return sar.Status.Allowed, nil
}

func waitAllowed(t *testing.T, who authenticationv1.UserInfo, attrs authorizationv1.ResourceAttributes, want bool) {
	t.Helper()
	what := fmt.Sprintf("%s to be allowed=%v to %s %s/%s in %s", who.Username, want, attrs.Verb, attrs.Resource, attrs.Subresource, attrs.Namespace)
	kit.Eventually(t, 30*time.Second, 200*time.Millisecond, what, func() (bool, string, error) {
		ok, err := allowed(who, attrs)
		return err == nil && ok == want, fmt.Sprintf("allowed=%v", ok), err
	})
}

// newMarker is a random string that occurs nowhere by chance.
func newMarker() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "KFTENANCY" + hex.EncodeToString(b)
}

// markerOffsets are where a marked image holds its marker.
var markerOffsets = []int{1<<20 + 17, 7<<20 + 4099}

// markedImage is markedMiB MiB of random bytes holding a fresh marker at
// markerOffsets, with the marker and the bytes' sha256.
func markedImage() (data []byte, mark, sum string) {
	data = make([]byte, markedMiB<<20)
	_, _ = rand.Read(data)
	mark = newMarker()
	for _, off := range markerOffsets {
		copy(data[off:], mark)
	}
	s := sha256.Sum256(data)
	return data, mark, hex.EncodeToString(s[:])
}

// markedClaim creates claim ns/name (class "" is the default one) and, as
// its namespace's owner, writes into it a disk.img of markedMiB MiB of
// random bytes holding a fresh marker; it returns the marker and the
// image's sha256. The writer pod is gone when it returns (a clone waits
// for a source no pod mounts writable).
func markedClaim(t *testing.T, ns, name, class string) (mark, sum string) {
	t.Helper()
	ctx := context.Background()
	pvc := kit.PVC(ns, name, claimSize)
	if class != "" {
		pvc.Spec.StorageClassName = ptr.To(class)
	}
	if err := kc.Create(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	mark = newMarker()
	var script strings.Builder
	fmt.Fprintf(&script, "set -e; dd if=/dev/urandom of=/data/disk.img bs=1M count=%d 2>/dev/null; ", markedMiB)
	for _, off := range markerOffsets {
		fmt.Fprintf(&script, "printf '%%s' \"$MARK\" | dd of=/data/disk.img bs=1 seek=%d conv=notrunc 2>/dev/null; ", off)
	}
	script.WriteString("sync; sha256sum /data/disk.img | cut -d' ' -f1 > /dev/termination-log")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mark-" + name},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "mark", Image: shellImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", script.String()}, Env: []corev1.EnvVar{{Name: "MARK", Value: mark}},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}},
		},
	}
	if err := kc.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	sum = podReport(t, kc, pod, 3*time.Minute, 500*time.Millisecond, "to write the marker")
	if len(sum) != 64 {
		t.Fatalf("marker writer of %s/%s reported %q", ns, name, sum)
	}
	deletePod(t, pod)
	return mark, sum
}

// deletePod deletes a pod and waits until it is gone.
func deletePod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	if err := kc.Delete(ctx, pod, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	kit.Eventually(t, time.Minute, 250*time.Millisecond, "pod "+pod.Namespace+"/"+pod.Name+" to go", func() (bool, string, error) {
		err := kc.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		return apierrors.IsNotFound(err), "", client.IgnoreNotFound(err)
	})
}

// scanResult is what a scan found: the claims it mounted and those whose
// contents hold the marker (claim: file or device, and how many lines).
type scanResult struct {
	scanned []string
	hits    []string
	files   string
}

// scan mounts every bound claim of ns, read-only, in one pod (Filesystem
// claims at a directory, Block claims as a device) and reports where mark
// occurs: grep -c over every file (a Filesystem claim holds disk.img) and
// every device, with NULs turned into line ends so that a sparse image is
// no single huge line. It is everything a user with edit in ns can read
// from a disk.
func scan(t *testing.T, ns, mark string) scanResult {
	t.Helper()
	ctx := context.Background()
	pvcs := &corev1.PersistentVolumeClaimList{}
	if err := kc.List(ctx, pvcs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var res scanResult
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "scan-" + randomSuffix()},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "scan", Image: shellImage, ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{{Name: "MARK", Value: mark}}}},
		},
	}
	ct := &pod.Spec.Containers[0]
	for _, p := range pvcs.Items {
		if p.Status.Phase != corev1.ClaimBound || p.DeletionTimestamp != nil {
			continue
		}
		i := len(res.scanned)
		vol := fmt.Sprintf("c%d", i)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: p.Name, ReadOnly: true}}})
		if ptr.Deref(p.Spec.VolumeMode, corev1.PersistentVolumeFilesystem) == corev1.PersistentVolumeBlock {
			ct.VolumeDevices = append(ct.VolumeDevices, corev1.VolumeDevice{Name: vol, DevicePath: fmt.Sprintf("/dev/scan%d", i)})
		} else {
			ct.VolumeMounts = append(ct.VolumeMounts, corev1.VolumeMount{Name: vol, MountPath: fmt.Sprintf("/scan/%d", i), ReadOnly: true})
		}
		res.scanned = append(res.scanned, p.Name)
	}
	if len(res.scanned) == 0 {
		return res
	}
	ct.Command = []string{"sh", "-c", `out=/dev/termination-log; : > $out; n=0
count() { tr '\000' '\n' < "$1" | grep -c -F "$MARK"; }
for d in /scan/*; do
  [ -d "$d" ] || continue
  for f in $(find "$d" -type f); do
    n=$((n+1)); c=$(count "$f"); [ "$c" = 0 ] || echo "hit $f $c" >> $out
  done
done
for b in /dev/scan*; do
  [ -b "$b" ] || continue
  n=$((n+1)); c=$(count "$b"); [ "$c" = 0 ] || echo "hit $b $c" >> $out
done
echo "scanned $n" >> $out`}
	if err := kc.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	defer deletePod(t, pod)
	report := podReport(t, kc, pod, 3*time.Minute, 500*time.Millisecond, "to scan the claims of "+ns)
	for _, line := range strings.Split(report, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "hit":
			res.hits = append(res.hits, claimOfPath(f[1], res.scanned)+" ("+f[1]+", "+f[2]+" lines)")
		case len(f) == 2 && f[0] == "scanned":
			res.files = f[1]
		}
	}
	return res
}

// claimOfPath maps /scan/<i>/... or /dev/scan<i> back to the claim.
func claimOfPath(path string, claims []string) string {
	var i int
	if _, err := fmt.Sscanf(path, "/scan/%d/", &i); err != nil {
		if _, err := fmt.Sscanf(path, "/dev/scan%d", &i); err != nil {
			return path
		}
	}
	if i >= 0 && i < len(claims) {
		return claims[i]
	}
	return path
}

// noMarker fails the test when mark occurs in any claim of ns: no byte
// crossed by route.
func noMarker(t *testing.T, route, ns, mark, whose string) {
	t.Helper()
	r := scan(t, ns, mark)
	if len(r.hits) > 0 {
		t.Errorf("%s: %s's marker crossed: it is in %v of namespace %s (scanned claims %v)", route, whose, r.hits, ns, r.scanned)
		return
	}
	if len(r.scanned) == 0 {
		t.Logf("%s: %s's marker is nowhere in %s: it has no bound claim", route, whose, ns)
		return
	}
	t.Logf("%s: %s's marker is in none of the %d bound claims of %s (%s files and devices scanned: %v)", route, whose, len(r.scanned), ns, r.files, r.scanned)
}

// hasMarker fails the test unless mark occurs in claim ns/name: what an
// authorised path must carry across (and proof that the scan finds it).
func hasMarker(t *testing.T, what, ns, name, mark string) {
	t.Helper()
	r := scan(t, ns, mark)
	for _, h := range r.hits {
		if strings.HasPrefix(h, name+" ") {
			t.Logf("%s: the marker is in %s/%s: %v", what, ns, name, r.hits)
			return
		}
	}
	t.Errorf("%s: the marker is not in %s/%s (hits %v, scanned %v)", what, ns, name, r.hits, r.scanned)
}

// refused checks that err is a refusal whose message names every one of
// wants (what is missing, who lacks it), and says so; it reports whether
// the attempt was refused at all.
func refused(t *testing.T, route string, err error, wants ...string) bool {
	t.Helper()
	if err == nil {
		t.Errorf("%s: admitted; want a refusal naming %q", route, wants)
		return false
	}
	checkNames(t, route, "refusal", err.Error(), wants...)
	t.Logf("%s: refused: %v", route, err)
	return true
}

// checkNames fails the test unless msg names every one of wants.
func checkNames(t *testing.T, route, what, msg string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(strings.ToLower(msg), strings.ToLower(w)) {
			t.Errorf("%s: %s %q does not name %q", route, what, msg, w)
		}
	}
}

// poll calls cond every interval until it holds or timeout passes, and
// says whether it held; unlike kit.Eventually, running out is no failure.
func poll(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// dataVolumeProblems is what a DataVolume says about itself: its phase,
// its conditions' reasons and messages, and the Warning events of it and
// its claim (where a refusal is explained).
func dataVolumeProblems(ns, name string) string {
	ctx := context.Background()
	var b strings.Builder
	dv := &cdiv1.DataVolume{}
	if err := kc.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, dv); err == nil {
		fmt.Fprintf(&b, "phase %s;", dv.Status.Phase)
		for _, c := range dv.Status.Conditions {
			fmt.Fprintf(&b, " %s=%s %s: %s;", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	b.WriteString(" warnings: ")
	b.WriteString(warningsAbout(ns, name))
	return b.String()
}

// warningsAbout lists the Warning events of objects named name in ns, one line.
func warningsAbout(ns, name string) string {
	return eventLine(ns, name, corev1.EventTypeWarning)
}

// eventsAbout lists the events of objects named name in ns, one line.
func eventsAbout(ns, name string) string { return eventLine(ns, name, "") }

func eventLine(ns, name, typ string) string {
	list := &corev1.EventList{}
	if err := kc.List(context.Background(), list, client.InNamespace(ns),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.name", name)}); err != nil {
		return err.Error()
	}
	var parts []string
	for _, e := range list.Items {
		if typ == "" || e.Type == typ {
			parts = append(parts, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message))
		}
	}
	return strings.Join(parts, " | ")
}

// settle waits until DataVolume ns/name ends (Succeeded or Failed) or
// timeout passes, whichever is first, and returns its last phase: on
// the unfixed code a route runs to the end, and the scan that follows
// must see what crossed.
func settle(ns, name string, timeout time.Duration) cdiv1.DataVolumePhase {
	var phase cdiv1.DataVolumePhase
	poll(timeout, time.Second, func() bool {
		dv := &cdiv1.DataVolume{}
		if err := kc.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, dv); err == nil {
			phase = dv.Status.Phase
		}
		return kit.Terminal(phase)
	})
	return phase
}

// cloneDataVolume is a DataVolume ns/name of claimSize cloning claim
// srcNS/src.
func cloneDataVolume(ns, name, srcNS, src string) *cdiv1.DataVolume {
	return kit.DataVolume(ns, name, &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: srcNS, Name: src}}, kit.WithStorage("", claimSize))
}

// dataSource is DataSource ns/name pointing at claim pvcNS/pvc.
func dataSource(ns, name, pvcNS, pvc string) *cdiv1.DataSource {
	return &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: pvcNS, Name: pvc}}}}
}

// sourceRefDataVolume is a DataVolume ns/name cloning through DataSource ns/ds.
func sourceRefDataVolume(ns, name, ds string) *cdiv1.DataVolume {
	dv := kit.DataVolume(ns, name, nil, kit.WithStorage("", claimSize))
	dv.Spec.SourceRef = &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: ds}
	return dv
}

// repoint points DataSource ns/name at claim pvcNS/pvc, as its editor.
func repoint(t *testing.T, c client.Client, ns, name, pvcNS, pvc string) {
	t.Helper()
	ds := &cdiv1.DataSource{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, ds); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(ds.DeepCopy())
	ds.Spec.Source = cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: pvcNS, Name: pvc}}
	if err := c.Patch(context.Background(), ds, patch); err != nil {
		t.Fatalf("re-pointing DataSource %s/%s at %s/%s: %v", ns, name, pvcNS, pvc, err)
	}
}

// dataImportCron is a DataImportCron as unstructured, so that
// spec.serviceAccountName (sa, "" leaves it unset) is sent as written.
func dataImportCron(ns, name, schedule, sa string, source map[string]any) *unstructured.Unstructured {
	spec := map[string]any{
		"schedule":          schedule,
		"managedDataSource": name + "-ds",
		"template": map[string]any{"spec": map[string]any{
			"source":  source,
			"storage": map[string]any{"resources": map[string]any{"requests": map[string]any{"storage": claimSize}}},
		}},
	}
	if sa != "" {
		spec["serviceAccountName"] = sa
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": cdiv1.SchemeGroupVersion.String(), "kind": "DataImportCron",
		"metadata": map[string]any{"namespace": ns, "name": name}, "spec": spec,
	}}
	return u
}

func pvcCronSource(ns, name string) map[string]any {
	return map[string]any{"pvc": map[string]any{"namespace": ns, "name": name}}
}

// yearly is a schedule that does not come round during a test: a pvc
// source is polled once, when the cron is created.
const yearly = "0 0 1 1 *"

// cronState is a DataImportCron's conditions and events, one line.
func cronState(ns, name string) (*cdiv1.DataImportCron, string) {
	cron := &cdiv1.DataImportCron{}
	if err := kc.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, cron); err != nil {
		return nil, err.Error()
	}
	var b strings.Builder
	for _, c := range cron.Status.Conditions {
		fmt.Fprintf(&b, "%s=%s %s: %s; ", c.Type, c.Status, c.Reason, c.Message)
	}
	fmt.Fprintf(&b, "imports %v; events: %s", cron.Status.CurrentImports, eventsAbout(ns, name))
	return cron, b.String()
}

// dataVolumeNames lists the DataVolumes of ns.
func dataVolumeNames(t *testing.T, ns string) []string {
	t.Helper()
	list := &cdiv1.DataVolumeList{}
	if err := kc.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, dv := range list.Items {
		names = append(names, dv.Name)
	}
	sort.Strings(names)
	return names
}

// serviceIP is Service ns/name's cluster IP (the host routes them).
func serviceIP(t *testing.T, ns, name string) string {
	t.Helper()
	svc := &corev1.Service{}
	if err := kc.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, svc); err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// forgedReview posts, from the test process (where any pod of A could
// post from: the host routes the Service's cluster IP), an AdmissionReview
// claiming that system:admin in group system:masters creates DataVolume
// ns/name cloning claim srcNS/src, straight to the mutating webhook. It
// returns the HTTP status, the body and the clone token the answer's patch
// carries, if any.
func forgedReview(t *testing.T, ns, name, srcNS, src string) (int, string, string) {
	t.Helper()
	dv := cloneDataVolume(ns, name, srcNS, src)
	dv.TypeMeta = metav1.TypeMeta{APIVersion: cdiv1.SchemeGroupVersion.String(), Kind: "DataVolume"}
	raw, err := json.Marshal(dv)
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("forged-" + randomSuffix()),
			Kind:      metav1.GroupVersionKind{Group: cdiv1.GroupName, Version: "v1beta1", Kind: "DataVolume"},
			Resource:  metav1.GroupVersionResource{Group: cdiv1.GroupName, Version: "v1beta1", Resource: "datavolumes"},
			Namespace: ns, Name: name, Operation: admissionv1.Create,
			UserInfo: authenticationv1.UserInfo{Username: "system:admin", Groups: []string{"system:masters", "system:authenticated"}},
			Object:   runtime.RawExtension{Raw: raw},
		},
	}
	body, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + net.JoinHostPort(serviceIP(t, installNS, apiService), "443") + "/datavolume-mutate"
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the attacker does not care whom it talks to
	resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		// A TLS layer that demands a client certificate ends here.
		return 0, err.Error(), ""
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, string(out), ""
	}
	var answer admissionv1.AdmissionReview
	if err := json.Unmarshal(out, &answer); err != nil || answer.Response == nil {
		return resp.StatusCode, string(out), ""
	}
	return resp.StatusCode, string(out), tokenInPatch(answer.Response.Patch)
}

// tokenInPatch finds the clone token a JSON patch sets.
func tokenInPatch(patch []byte) string {
	var ops []struct {
		Op    string          `json:"op"`
		Path  string          `json:"path"`
		Value json.RawMessage `json:"value"`
	}
	if json.Unmarshal(patch, &ops) != nil {
		return ""
	}
	key := "/metadata/annotations/" + strings.ReplaceAll(cdiv1.AnnCloneToken, "/", "~1")
	for _, op := range ops {
		var s string
		var m map[string]string
		switch {
		case op.Path == key && json.Unmarshal(op.Value, &s) == nil:
			return s
		case op.Path == "/metadata/annotations" && json.Unmarshal(op.Value, &m) == nil && m[cdiv1.AnnCloneToken] != "":
			return m[cdiv1.AnnCloneToken]
		}
	}
	return ""
}

// stolenCloneToken is the strongest short clone token a tenant could hold
// for a clone of claim srcNS/src into ns/target: the one the webhook hands
// to a forged review when it does (the hole), else one the test signs with
// the install's own key, as if it had leaked. Either is a valid signature
// over exactly that clone; the routes must refuse it anyway.
func stolenCloneToken(t *testing.T, ns, target, srcNS, src string) string {
	t.Helper()
	if _, _, tok := forgedReview(t, ns, target, srcNS, src); tok != "" {
		t.Logf("the forged review's answer carries a clone token for %s/%s -> %s/%s", srcNS, src, ns, target)
		return tok
	}
	tok := signedToken(t, token.CloneTokenIssuer, token.NewClonePayload(token.ResourcePVC, srcNS, src, ns, target))
	t.Logf("no token from the forged review: using one signed with the install's key for %s/%s -> %s/%s", srcNS, src, ns, target)
	return tok
}

// certsIn parses every certificate of every Secret in ns.
func certsIn(t *testing.T, ns string) map[string][]*x509.Certificate {
	t.Helper()
	list := &corev1.SecretList{}
	if err := kc.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string][]*x509.Certificate{}
	for _, s := range list.Items {
		for _, v := range s.Data {
			rest := v
			for {
				var b *pem.Block
				b, rest = pem.Decode(rest)
				if b == nil {
					break
				}
				if b.Type != "CERTIFICATE" {
					continue
				}
				if c, err := x509.ParseCertificate(b.Bytes); err == nil {
					out[s.Name] = append(out[s.Name], c)
				}
			}
		}
	}
	return out
}

// namesNamespace says whether a DNS name lies in namespace ns's part of
// the cluster's names: <anything>.<ns>, <anything>.<ns>.svc[.cluster.local].
func namesNamespace(dnsName, ns string) bool {
	labels := strings.Split(strings.TrimSuffix(dnsName, "."), ".")
	return slices.Contains(labels[1:], ns)
}

// workerPods records every Kubefill worker pod (label app=containerized-
// data-importer) created in some namespaces, as the API server stored it,
// from a watch, so that pods that live a second are seen too.
type workerPods struct {
	mu   sync.Mutex
	pods map[string]corev1.Pod
}

func watchWorkerPods(t *testing.T, c client.WithWatch, namespaces ...string) *workerPods {
	t.Helper()
	w := &workerPods{pods: map[string]corev1.Pod{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, ns := range namespaces {
		wi, err := c.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns), client.MatchingLabels{cdiv1.LabelApp: cdiv1.LabelAppValue})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer wi.Stop()
			for ev := range wi.ResultChan() {
				if p, ok := ev.Object.(*corev1.Pod); ok {
					w.mu.Lock()
					if _, seen := w.pods[p.Namespace+"/"+p.Name]; !seen {
						w.pods[p.Namespace+"/"+p.Name] = *p.DeepCopy()
					}
					w.mu.Unlock()
				}
			}
		}()
	}
	return w
}

func (w *workerPods) list() []corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []corev1.Pod
	for _, p := range w.pods {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace+out[i].Name < out[j].Namespace+out[j].Name })
	return out
}

// tokenMount says how a pod would carry its ServiceAccount's token, or "".
func tokenMount(p *corev1.Pod) string {
	var why []string
	if p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken {
		why = append(why, "automountServiceAccountToken is not false")
	}
	for _, v := range p.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.ServiceAccountToken != nil {
				why = append(why, "volume "+v.Name+" projects a ServiceAccount token")
			}
		}
	}
	for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		for _, m := range c.VolumeMounts {
			if strings.HasPrefix(m.MountPath, "/var/run/secrets/kubernetes.io/serviceaccount") {
				why = append(why, "container "+c.Name+" mounts "+m.MountPath)
			}
		}
	}
	return strings.Join(why, "; ")
}
