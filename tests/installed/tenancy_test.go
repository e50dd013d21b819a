package installed

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"
	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/pkg/clone"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/kit"
)

// The routes of ../shared/reference/tenant-isolation-findings.md (issue 24),
// each attempted as a tenant with edit in A only, and the authorised paths
// next to them. See tenancy_helpers_test.go for the tenant, the marker and
// the scan.

// TestTenancyCronOtherNamespacePVC is H1: a DataImportCron in A whose
// source is a claim of B. Its imports are clones the controller creates,
// so they must be authorised for the cron's ServiceAccount (here A's
// default, which may not clone from B): refused at admission, naming the
// missing permission and the ServiceAccount, and no byte of B reaches A.
func TestTenancyCronOtherNamespacePVC(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := tenancyNamespaces(t)
	u := newTenant(t)
	bind(t, a, "edit", u.subject(), u.info())
	mark, _ := markedClaim(t, b, "secret-disk", "")

	const route = "H1 DataImportCron source.pvc in B"
	err := u.c.Create(ctx, dataImportCron(a, "steal", yearly, "", pvcCronSource(b, "secret-disk")))
	if !refused(t, route, err, "datavolumes/source", "ServiceAccount", a+"/default", b) {
		// The hole: the controller imports B's claim on its own authority.
		var dvName string
		poll(2*time.Minute, time.Second, func() bool {
			cron, _ := cronState(a, "steal")
			if cron != nil && len(cron.Status.CurrentImports) > 0 {
				dvName = cron.Status.CurrentImports[0].DataVolumeName
			}
			return dvName != ""
		})
		if dvName != "" {
			t.Errorf("%s: the controller created import DataVolume %s/%s, which ended %s", route, a, dvName, settle(a, dvName, tenancyWait))
		}
	}
	noMarker(t, route, a, mark, "B")
}

// TestTenancyCronServiceAccountLosesRight is H1's second half: a cron
// admitted while its ServiceAccount may clone from B, whose ServiceAccount
// then loses the right, gets condition Progressing=False reason
// NotAuthorized at its next poll and no DataVolume: the controller checks
// again before each import rather than trusting the admission.
func TestTenancyCronServiceAccountLosesRight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := tenancyNamespaces(t)
	u := newTenant(t)
	bind(t, a, "edit", u.subject(), u.info())
	if err := cl.WaitServiceAccount(ctx, a); err != nil {
		t.Fatal(err)
	}
	sa := serviceAccountInfo(a, "default")
	rb := bind(t, b, cloneSourcerRole, serviceAccountSubject(a, "default"), sa)

	// B's claim does not exist yet: the first poll (at creation) finds
	// nothing to import; the schedule polls every minute after.
	const route = "H1 a cron whose ServiceAccount lost the right"
	if err := u.c.Create(ctx, dataImportCron(a, "revoked", "* * * * *", "", pvcCronSource(b, "later"))); err != nil {
		t.Fatalf("%s: a cron whose ServiceAccount %s may clone from %s was refused: %v", route, sa.Username, b, err)
	}
	kit.Eventually(t, time.Minute, time.Second, "the cron's first poll", func() (bool, string, error) {
		cron, state := cronState(a, "revoked")
		return cron != nil && cron.Annotations[cdiv1.AnnNextCronTime] != "", state, nil
	})
	unbind(t, rb, sa, authorizationv1.ResourceAttributes{Namespace: b, Verb: "create", Group: cdiv1.GroupName,
		Resource: "datavolumes", Subresource: cdiv1.DataVolumeCloneSourceSubresource})
	// The claim is made and marked just after a scheduled poll, so that the
	// next one finds it whole.
	for s := time.Now().Second(); s < 1 || s > 8; s = time.Now().Second() {
		time.Sleep(250 * time.Millisecond)
	}
	mark, _ := markedClaim(t, b, "later", "")

	var cond cdiv1.DataImportCronCondition
	var dvs []string
	poll(150*time.Second, 2*time.Second, func() bool {
		cron, _ := cronState(a, "revoked")
		if cron != nil {
			for _, c := range cron.Status.Conditions {
				if c.Type == cdiv1.DataImportCronProgressing {
					cond = c
				}
			}
		}
		dvs = dataVolumeNames(t, a)
		return cond.Reason == "NotAuthorized" || len(dvs) > 0
	})
	_, state := cronState(a, "revoked")
	if cond.Status != corev1.ConditionFalse || cond.Reason != "NotAuthorized" {
		t.Errorf("%s: Progressing is %s %s, want False NotAuthorized: %s", route, cond.Status, cond.Reason, state)
	} else {
		checkNames(t, route, "the cron's condition and events", state, "datavolumes/source", "default", b)
		t.Logf("%s: %s", route, state)
	}
	if len(dvs) > 0 {
		for _, name := range dvs {
			t.Errorf("%s: the controller created DataVolume %s/%s after the right was revoked; it ended %s", route, a, name, settle(a, name, tenancyWait))
		}
	}
	noMarker(t, route, a, mark, "B")
}

// TestTenancyCronAuthorised is the authorised cron: its ServiceAccount
// (spec.serviceAccountName) is bound to clone-sourcer in B, so it imports
// B's claim, with every byte.
func TestTenancyCronAuthorised(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := tenancyNamespaces(t)
	u := newTenant(t)
	bind(t, a, "edit", u.subject(), u.info())
	if err := kc.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: a, Name: "golden-reader"}}); err != nil {
		t.Fatal(err)
	}
	bind(t, b, cloneSourcerRole, serviceAccountSubject(a, "golden-reader"), serviceAccountInfo(a, "golden-reader"))
	mark, sum := markedClaim(t, b, "golden", "")

	if err := u.c.Create(ctx, dataImportCron(a, "golden", yearly, "golden-reader", pvcCronSource(b, "golden"))); err != nil {
		t.Fatalf("a cron whose ServiceAccount may clone from %s was refused: %v", b, err)
	}
	var dvName string
	kit.Eventually(t, 2*time.Minute, time.Second, "the cron's import", func() (bool, string, error) {
		cron, state := cronState(a, "golden")
		if cron != nil && len(cron.Status.CurrentImports) > 0 {
			dvName = cron.Status.CurrentImports[0].DataVolumeName
		}
		return dvName != "", state, nil
	})
	waitSucceeded(t, a, dvName, tenancyWait)
	if got := readBack(t, a, dvName, markedMiB<<20); got != sum {
		t.Errorf("the cron's import %s/%s hashes %s, B's claim %s", a, dvName, got, sum)
	}
	hasMarker(t, "authorised cron", a, dvName, mark)
}

// TestTenancyForgedAdmissionReview is H2's oracle: an AdmissionReview
// posted straight to the mutating webhook, claiming system:masters. The
// webhook must not answer it (kube-apiserver authenticates to it with a
// client certificate), and no answer may carry a clone token.
func TestTenancyForgedAdmissionReview(t *testing.T) {
	t.Parallel()
	a, b := tenancyNamespaces(t)
	const route = "H2 forged AdmissionReview"
	status, body, tok := forgedReview(t, a, "t-oracle", b, "secret-disk")
	t.Logf("%s: answered %d: %.300s", route, status, body)
	if tok != "" {
		t.Errorf("%s: the answer (HTTP %d) carries a signed clone token for %s/secret-disk -> %s/t-oracle", route, status, b, a)
	}
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden:
		checkNames(t, route, "the answer", body, "certificate")
	case 0:
		// The TLS handshake refused a caller without a certificate.
		checkNames(t, route, "the TLS error", body, "certificate")
	default:
		t.Errorf("%s: HTTP %d, want 401 or 403 for a caller that is not kube-apiserver", route, status)
	}
}

// TestTenancyCloneToken is the rest of H2: what a tenant could do with a
// signed clone token for B's claim (the oracle's, or one that leaked),
// each in a namespace A of its own against the same B.
func TestTenancyCloneToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := testNamespace(t, "tenancy-b")
	const src = "secret-disk"
	mark, _ := markedClaim(t, b, src, "")
	attacker := func(t *testing.T) (string, *tenant) {
		a := testNamespace(t, "tenancy-a")
		u := newTenant(t)
		bind(t, a, "edit", u.subject(), u.info())
		return a, u
	}
	// waitClone waits until the controller explains that the DataVolume
	// may not clone its new source, naming the missing permission, and
	// lets a clone that was not stopped run to its end.
	waitRefusal := func(t *testing.T, route, a, name string, wants ...string) {
		t.Helper()
		var problems string
		poll(2*time.Minute, 2*time.Second, func() bool {
			problems = dataVolumeProblems(a, name)
			return strings.Contains(problems, "datavolumes/source") || strings.Contains(problems, "phase Succeeded") || strings.Contains(problems, "phase Failed")
		})
		checkNames(t, route, "the DataVolume's conditions and events", problems, wants...)
		t.Logf("%s: %s", route, problems)
		if phase := settle(a, name, 30*time.Second); phase == cdiv1.Succeeded {
			t.Errorf("%s: DataVolume %s/%s cloned the new source", route, a, name)
		}
	}

	t.Run("annotation planted on an admitted DataVolume", func(t *testing.T) {
		t.Parallel()
		const route = "H2 clone token planted on an admitted DataVolume"
		a, u := attacker(t)
		// Admitted as a clone within A, from a DataSource that names a claim
		// not there yet: the DataVolume waits.
		if err := u.c.Create(ctx, dataSource(a, "ds", a, "not-yet")); err != nil {
			t.Fatal(err)
		}
		if err := u.c.Create(ctx, sourceRefDataVolume(a, "t-oracle", "ds")); err != nil {
			t.Fatalf("a clone within A was refused: %v", err)
		}
		tok := stolenCloneToken(t, a, "t-oracle", b, src)
		dv := &cdiv1.DataVolume{}
		if err := u.c.Get(ctx, types.NamespacedName{Namespace: a, Name: "t-oracle"}, dv); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(dv.DeepCopy())
		if dv.Annotations == nil {
			dv.Annotations = map[string]string{}
		}
		dv.Annotations[cdiv1.AnnCloneToken] = tok
		refused(t, route, u.c.Patch(ctx, dv, patch), cdiv1.AnnCloneToken)
		repoint(t, u.c, a, "ds", b, src)
		waitRefusal(t, route, a, "t-oracle", "datavolumes/source", b)
		noMarker(t, route, a, mark, "B")
	})

	t.Run("token supplied at create", func(t *testing.T) {
		t.Parallel()
		const route = "H2 clone tokens supplied when the DataVolume is created"
		a, u := attacker(t)
		if err := u.c.Create(ctx, dataSource(a, "ds", a, "not-yet")); err != nil {
			t.Fatal(err)
		}
		short := stolenCloneToken(t, a, "t-create", b, src)
		ext := signedToken(t, token.ExtendedCloneTokenIssuer, token.NewClonePayload(token.ResourcePVC, b, src, a, "t-create"))
		dv := sourceRefDataVolume(a, "t-create", "ds")
		dv.Annotations = map[string]string{cdiv1.AnnCloneToken: short, cdiv1.AnnExtendedCloneToken: ext}
		if err := u.c.Create(ctx, dv); err != nil {
			t.Logf("%s: refused: %v", route, err)
		} else {
			got := &cdiv1.DataVolume{}
			if err := kc.Get(ctx, client.ObjectKeyFromObject(dv), got); err != nil {
				t.Fatal(err)
			}
			if got.Annotations[cdiv1.AnnCloneToken] == short {
				t.Errorf("%s: the DataVolume kept the %s its creator supplied", route, cdiv1.AnnCloneToken)
			}
			if got.Annotations[cdiv1.AnnExtendedCloneToken] == ext {
				t.Errorf("%s: the DataVolume kept the %s its creator supplied", route, cdiv1.AnnExtendedCloneToken)
			}
			repoint(t, u.c, a, "ds", b, src)
			waitRefusal(t, route, a, "t-create", "datavolumes/source", b)
		}
		noMarker(t, route, a, mark, "B")
	})

	t.Run("bare claim with a short token", func(t *testing.T) {
		t.Parallel()
		const route = "H2 short clone token on a bare claim"
		a, u := attacker(t)
		// B's own VolumeCloneSource, as B's owner made it for B's clones.
		vcs := &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: b, Name: "vcs-" + randomSuffix()},
			Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: src}}}
		if err := kc.Create(ctx, vcs); err != nil {
			t.Fatal(err)
		}
		tok := stolenCloneToken(t, a, "bare", b, src)
		pvc := kit.PVC(a, "bare", claimSize, kit.SourceRef(cdiv1.VolumeCloneSourceRef, vcs.Name),
			kit.Annotate(map[string]string{cdiv1.AnnDataSourceNamespace: b, cdiv1.AnnCloneToken: tok}))
		if err := u.c.Create(ctx, pvc); err != nil {
			t.Logf("%s: refused: %v", route, err)
		} else {
			var msg string
			var phase corev1.PersistentVolumeClaimPhase
			poll(2*time.Minute, 2*time.Second, func() bool {
				got := &corev1.PersistentVolumeClaim{}
				if err := kc.Get(ctx, client.ObjectKeyFromObject(pvc), got); err != nil {
					return false
				}
				msg, phase = got.Annotations[cdiv1.AnnRunningConditionMessage], got.Status.Phase
				return msg != "" || phase == corev1.ClaimBound
			})
			if phase == corev1.ClaimBound {
				t.Errorf("%s: the claim was populated from %s/%s", route, b, src)
			}
			checkNames(t, route, "the claim's running condition", msg+" warnings: "+warningsAbout(a, "bare"), cdiv1.AnnExtendedCloneToken)
			t.Logf("%s: claim %s: %s", route, phase, msg)
		}
		noMarker(t, route, a, mark, "B")
	})

	t.Run("DataSource re-pointed after admission", func(t *testing.T) {
		t.Parallel()
		const route = "H2 DataSource re-pointed to B after admission"
		a, u := attacker(t)
		if err := u.c.Create(ctx, dataSource(a, "ds", a, "not-yet")); err != nil {
			t.Fatal(err)
		}
		if err := u.c.Create(ctx, sourceRefDataVolume(a, "t-swap", "ds")); err != nil {
			t.Fatalf("a clone within A was refused: %v", err)
		}
		repoint(t, u.c, a, "ds", b, src)
		waitRefusal(t, route, a, "t-swap", "datavolumes/source", b, u.name)
		noMarker(t, route, a, mark, "B")
	})
}

// signedToken is a token the test signs with the install's own key, as if
// the key had leaked: the strongest forgery a route can be shown.
func signedToken(t *testing.T, issuer string, p *token.Payload) string {
	t.Helper()
	s := &corev1.Secret{}
	if err := kc.Get(context.Background(), types.NamespacedName{Namespace: installNS, Name: token.DefaultSigningKeySecretName}, s); err != nil {
		t.Fatal(err)
	}
	key, err := token.DecodePrivateKeyPEM(s.Data["id_rsa"])
	if err != nil {
		t.Fatal(err)
	}
	tok, err := token.NewGenerator(issuer, key, token.DefaultCloneTokenLifetime).Generate(p)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestTenancyUploadClientName is H3: the tenant edits the
// cdi.kubevirt.io/uploadClientName annotation of her own host-assisted
// clone's prime to the upload proxy's name. The client certificate the
// controller issues for the clone must keep the name the controller
// computes, and no certificate of hers may POST into B's upload that waits
// for data: B's DataVolume stays UploadReady and no byte of A lands in B.
func TestTenancyUploadClientName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := tenancyNamespaces(t)
	u := newTenant(t)
	bind(t, a, "edit", u.subject(), u.info())
	const route = "H3 uploadClientName edited on a clone's prime"

	// B: a VM disk upload waiting for its data.
	if err := kc.Create(ctx, kit.DataVolume(b, "victim", kit.Upload(), kit.WithStorage("", claimSize))); err != nil {
		t.Fatal(err)
	}
	kit.WaitDataVolume(t, kc, b, "victim", 3*time.Minute, func(dv *cdiv1.DataVolume) bool { return dv.Status.Phase == cdiv1.UploadReady })

	// A: her own disk, held writable by a pod so that her clone of it waits
	// with its prime made, and the clone pinned to host-assisted copy.
	markedClaim(t, a, "own", "")
	holder := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: a, Name: "holder"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "hold", Image: shellImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sleep", "3600"}, VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "own"}}}},
		},
	}
	if err := u.c.Create(ctx, holder); err != nil {
		t.Fatal(err)
	}
	vcs := &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: a, Name: "vcs-own"},
		Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "own"}}}
	if err := u.c.Create(ctx, vcs); err != nil {
		t.Fatal(err)
	}
	target := kit.PVC(a, "cert-tgt", claimSize, kit.SourceRef(cdiv1.VolumeCloneSourceRef, vcs.Name),
		kit.Annotate(map[string]string{cdiv1.AnnCloneType: string(cdiv1.CloneStrategyHostAssisted)}))
	if err := u.c.Create(ctx, target); err != nil {
		t.Fatal(err)
	}
	prime := &corev1.PersistentVolumeClaim{}
	kit.Eventually(t, 2*time.Minute, 500*time.Millisecond, "the clone's prime in "+a, func() (bool, string, error) {
		err := u.c.Get(ctx, types.NamespacedName{Namespace: a, Name: clone.TmpClaimName(target.UID)}, prime)
		return err == nil, "", client.IgnoreNotFound(err)
	})
	computed := prime.Annotations[cdiv1.AnnUploadClientName]
	patch := client.MergeFrom(prime.DeepCopy())
	if prime.Annotations == nil {
		prime.Annotations = map[string]string{}
	}
	prime.Annotations[cdiv1.AnnUploadClientName] = certs.UploadServerClientName
	if err := u.c.Patch(ctx, prime, patch); err != nil {
		t.Logf("%s: editing the prime refused: %v", route, err)
	}

	// Her watch catches the source pod's certificate Secret even if the
	// clone deletes it at once.
	secrets, err := u.c.Watch(ctx, &corev1.SecretList{}, client.InNamespace(a))
	if err != nil {
		t.Fatal(err)
	}
	defer secrets.Stop()
	deletePod(t, holder)
	var stolen *corev1.Secret
	timeout := time.After(3 * time.Minute)
	for stolen == nil {
		select {
		case ev := <-secrets.ResultChan():
			if s, ok := ev.Object.(*corev1.Secret); ok && ev.Type != watch.Deleted && isCloneClientSecret(s, target.UID) {
				stolen = s.DeepCopy()
			}
		case <-timeout:
			t.Fatalf("%s: no client certificate Secret %s/%s within 3 minutes: %s", route, a, clone.SourcePodName(target.UID), describeDataVolume(kc, a, "cert-tgt"))
		}
	}
	cert := parseCert(t, stolen.Data[corev1.TLSCertKey])
	t.Logf("%s: the clone's client certificate: CN %q, issuer %q, valid %s (computed name %q)", route, cert.Subject.CommonName, cert.Issuer.CommonName,
		cert.NotAfter.Sub(cert.NotBefore).Round(time.Minute), computed)
	if cert.Subject.CommonName == certs.UploadServerClientName {
		t.Errorf("%s: the controller issued a client certificate with the upload proxy's name %q, read back from the prime", route, certs.UploadServerClientName)
	}
	if computed != "" && cert.Subject.CommonName != computed {
		t.Errorf("%s: the certificate's CN %q is not the name the controller computed for the clone (%q)", route, cert.Subject.CommonName, computed)
	}
	if life := cert.NotAfter.Sub(cert.NotBefore); life > 24*time.Hour {
		t.Errorf("%s: the clone's client certificate lives %s; it should last no longer than the clone", route, life.Round(time.Hour))
	}

	// With it, she posts her own bytes straight to B's upload pod.
	data, aMark, _ := markedImage()
	url := uploadPodURL(t, b)
	code, body, err := postWithCert(url+"/v1beta1/upload", stolen.Data[corev1.TLSCertKey], stolen.Data[corev1.TLSPrivateKeyKey], data)
	switch {
	case err != nil:
		t.Logf("%s: B's upload pod refused the connection: %v", route, err)
	case code/100 == 2:
		t.Errorf("%s: B's upload pod took A's bytes with the stolen certificate: %d %s", route, code, body)
		// Let B's DataVolume finish with them, so the scan sees its claim.
		t.Logf("%s: B's upload DataVolume ended %s", route, settle(b, "victim", 2*time.Minute))
	default:
		t.Logf("%s: B's upload pod refused the certificate: %d %s", route, code, strings.TrimSpace(body))
	}
	time.Sleep(5 * time.Second)
	if dv := (&cdiv1.DataVolume{}); kc.Get(ctx, types.NamespacedName{Namespace: b, Name: "victim"}, dv) == nil && dv.Status.Phase != cdiv1.UploadReady {
		t.Errorf("%s: B's upload DataVolume is %s, want still UploadReady", route, dv.Status.Phase)
	}
	noMarker(t, route, b, aMark, "A")
}

// isCloneClientSecret says whether s holds the client certificate of the
// clone into the target of UID uid: the source pod's Secret, or any of the
// clone's Secrets whose certificate is for clients only.
func isCloneClientSecret(s *corev1.Secret, uid types.UID) bool {
	if s.Name != clone.SourcePodName(uid) && s.Labels[cdiv1.LabelOwnedByUID] != string(uid) {
		return false
	}
	blk, _ := pem.Decode(s.Data[corev1.TLSCertKey])
	if blk == nil || len(s.Data[corev1.TLSPrivateKeyKey]) == 0 {
		return false
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	return err == nil && slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth) && !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
}

func parseCert(t *testing.T, pemBytes []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(pemBytes)
	if blk == nil {
		t.Fatal("no PEM certificate")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// uploadPodURL is https://<IP>:<port> of ns's upload server pod, once it
// runs: where any pod of the cluster reaches it (the host routes pod IPs).
func uploadPodURL(t *testing.T, ns string) string {
	t.Helper()
	var url string
	kit.Eventually(t, 2*time.Minute, time.Second, "an upload server pod in "+ns, func() (bool, string, error) {
		pods := &corev1.PodList{}
		if err := kc.List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels{cdiv1.LabelComponent: "upload-server"}); err != nil {
			return false, "", err
		}
		for _, p := range pods.Items {
			if p.Status.PodIP != "" && p.Status.Phase == corev1.PodRunning {
				url = "https://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(contract.UploadServerPort))
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("%d pods", len(pods.Items)), nil
	})
	return url
}

// postWithCert POSTs body to url with a client certificate, trusting any
// server (the attacker only wants in).
func postWithCert(url string, certPEM, keyPEM, body []byte) (int, string, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return 0, "", err
	}
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true}}} //nolint:gosec // the attacker does not check the server
	resp, err := hc.Post(url, "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out), nil
}

// TestTenancyPollerCredentials is H4: a registry cron in A whose secretRef
// and certConfigMap name a Secret and a ConfigMap that exist only in the
// install namespace. No poller may mount them, the cron says why, and the
// credentials never reach the tenant's registry (the test's, on the host,
// which asks for Basic credentials and records what it gets). It lists its
// own registry as insecure in the CDIConfig, which no other test reads.
func TestTenancyPollerCredentials(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := testNamespace(t, "tenancy-a")
	u := newTenant(t)
	bind(t, a, "edit", u.subject(), u.info())
	const route = "H4 registry secretRef naming an install-namespace Secret"

	user, pass := "kf-user-"+randomSuffix(), newMarker()
	secretName, cmName := "regcreds-"+randomSuffix(), "regca-"+randomSuffix()
	creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: installNS, Name: secretName},
		Data: map[string][]byte{"accessKeyId": []byte(user), "secretKey": []byte(pass)}}
	caCM := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: installNS, Name: cmName}}
	bundle := &corev1.ConfigMap{}
	if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.BundleName(certs.UploadServerSigner)}, bundle); err == nil {
		caCM.Data = map[string]string{"ca.pem": bundle.Data[certs.BundleKey]}
	}
	for _, o := range []client.Object{creds, caCM} {
		if err := kc.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = kc.Delete(context.Background(), o) })
	}
	reg := startFakeRegistry(t)
	allowInsecureRegistry(t, reg.host)

	cron := dataImportCron(a, "reg", yearly, "", map[string]any{"registry": map[string]any{
		"url": "docker://" + reg.host + "/tenant/image:latest", "secretRef": secretName, "certConfigMap": cmName}})
	if err := u.c.Create(ctx, cron); err != nil {
		refused(t, route, err, secretName, a)
	} else {
		var state string
		poll(2*time.Minute, 2*time.Second, func() bool {
			_, state = cronState(a, "reg")
			return strings.Contains(state, secretName) || reg.sawPassword(user, pass)
		})
		checkNames(t, route, "the cron's conditions and events", state, secretName, a)
		t.Logf("%s: %s", route, state)
		// A poller that was started gets its chance to send them.
		poll(45*time.Second, 2*time.Second, func() bool { return reg.sawPassword(user, pass) })
	}
	if refs := installNamespaceRefs(t, secretName, cmName); len(refs) > 0 {
		t.Errorf("%s: objects of %s use what the tenant named: %v", route, installNS, refs)
	}
	if reg.sawPassword(user, pass) {
		t.Errorf("%s: the tenant's registry received the credentials of %s/%s", route, installNS, secretName)
	}
	t.Logf("%s: the tenant's registry saw %d requests: %v", route, len(reg.requests()), reg.requests())
}

// fakeRegistry is the tenant's registry: it asks every caller for Basic
// credentials and records the requests and their Authorization headers.
type fakeRegistry struct {
	host string
	mu   sync.Mutex
	seen []string
}

func startFakeRegistry(t *testing.T) *fakeRegistry {
	t.Helper()
	gw, err := cl.GatewayAddress()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(gw, "0"))
	if err != nil {
		t.Fatal(err)
	}
	r := &fakeRegistry{host: ln.Addr().String()}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		auth := req.Header.Get("Authorization")
		r.mu.Lock()
		r.seen = append(r.seen, req.Method+" "+req.URL.Path+" auth="+auth)
		r.mu.Unlock()
		if auth == "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="tenant"`)
			http.Error(w, "credentials, please", http.StatusUnauthorized)
			return
		}
		http.Error(w, "manifest unknown", http.StatusNotFound)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return r
}

func (r *fakeRegistry) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

func (r *fakeRegistry) sawPassword(user, pass string) bool {
	basic := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	for _, s := range r.requests() {
		if strings.Contains(s, basic) || strings.Contains(s, pass) {
			return true
		}
	}
	return false
}

// allowInsecureRegistry lists host in the CDIConfig's insecureRegistries
// (through the CDI resource when it is the config's authority) until the
// test ends, so that the poller talks plain HTTP to the test's registry.
func allowInsecureRegistry(t *testing.T, host string) {
	t.Helper()
	ctx := context.Background()
	edit := func(add bool) error {
		change := func(list []string) []string {
			list = slices.DeleteFunc(slices.Clone(list), func(s string) bool { return s == host })
			if add {
				list = append(list, host)
			}
			return list
		}
		cdis := &cdiv1.CDIList{}
		if err := kc.List(ctx, cdis); err != nil {
			return err
		}
		if _, authoritative, err := controller.ConfigSpecFromCDI(cdis.Items); err == nil && authoritative {
			for i := range cdis.Items {
				cr := &cdis.Items[i]
				if _, ok := cr.Annotations[controller.AnnConfigAuthority]; !ok {
					continue
				}
				if cr.Spec.Config == nil {
					cr.Spec.Config = &cdiv1.CDIConfigSpec{}
				}
				cr.Spec.Config.InsecureRegistries = change(cr.Spec.Config.InsecureRegistries)
				return kc.Update(ctx, cr)
			}
		}
		config := &cdiv1.CDIConfig{}
		if err := kc.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); err != nil {
			return err
		}
		config.Spec.InsecureRegistries = change(config.Spec.InsecureRegistries)
		return kc.Update(ctx, config)
	}
	kit.Eventually(t, time.Minute, time.Second, "insecureRegistries to list "+host, func() (bool, string, error) {
		config := &cdiv1.CDIConfig{}
		if err := kc.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); err != nil {
			return false, "", client.IgnoreNotFound(err)
		}
		if slices.Contains(config.Spec.InsecureRegistries, host) {
			return true, "", nil
		}
		// Tried again on a conflict: the controller writes the CDI resource
		// and CDIConfig too.
		if err := edit(true); err != nil && !apierrors.IsConflict(err) {
			return false, "", err
		}
		return false, fmt.Sprintf("%v", config.Spec.InsecureRegistries), nil
	})
	t.Cleanup(func() {
		poll(30*time.Second, time.Second, func() bool { return edit(false) == nil })
	})
}

// installNamespaceRefs lists the CronJobs, Jobs and pods of the install
// namespace whose pods would mount or read any of names (a Secret or a
// ConfigMap), as env, envFrom or volume.
func installNamespaceRefs(t *testing.T, names ...string) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	check := func(kind, name string, spec corev1.PodSpec) {
		uses := func(n string) {
			if slices.Contains(names, n) {
				out = append(out, fmt.Sprintf("%s %s/%s uses %s", kind, installNS, name, n))
			}
		}
		for _, v := range spec.Volumes {
			if v.Secret != nil {
				uses(v.Secret.SecretName)
			}
			if v.ConfigMap != nil {
				uses(v.ConfigMap.Name)
			}
			if v.Projected != nil {
				for _, s := range v.Projected.Sources {
					if s.Secret != nil {
						uses(s.Secret.Name)
					}
					if s.ConfigMap != nil {
						uses(s.ConfigMap.Name)
					}
				}
			}
		}
		for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					uses(e.ValueFrom.SecretKeyRef.Name)
				}
				if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
					uses(e.ValueFrom.ConfigMapKeyRef.Name)
				}
			}
			for _, e := range c.EnvFrom {
				if e.SecretRef != nil {
					uses(e.SecretRef.Name)
				}
				if e.ConfigMapRef != nil {
					uses(e.ConfigMapRef.Name)
				}
			}
		}
	}
	cronJobs, jobs, pods := &batchv1.CronJobList{}, &batchv1.JobList{}, &corev1.PodList{}
	if err := kc.List(ctx, cronJobs, client.InNamespace(installNS)); err != nil {
		t.Fatal(err)
	}
	for _, cj := range cronJobs.Items {
		check("CronJob", cj.Name, cj.Spec.JobTemplate.Spec.Template.Spec)
	}
	if err := kc.List(ctx, jobs, client.InNamespace(installNS)); err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs.Items {
		check("Job", j.Name, j.Spec.Template.Spec)
	}
	if err := kc.List(ctx, pods, client.InNamespace(installNS)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		check("Pod", p.Name, p.Spec)
	}
	return out
}

// TestTenancyServingCertificateNames is H5: a claim of A named
// victim.<B>.svc marked as an upload target. Its upload server's
// certificate must name only A's Service (<svc>.<A>.svc and
// <svc>.<A>.svc.cluster.local, <svc> a name the controller chose): no
// Secret of A may hold a certificate valid for a name of B.
func TestTenancyServingCertificateNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := tenancyNamespaces(t)
	u := newTenant(t)
	bind(t, a, "edit", u.subject(), u.info())
	const route = "H5 claim named victim.<B>.svc"
	name := "victim." + b + ".svc"
	pvc := kit.PVC(a, name, claimSize, kit.Annotate(map[string]string{cdiv1.AnnUploadRequest: ""}))
	if err := u.c.Create(ctx, pvc); err != nil {
		t.Logf("%s: refused: %v", route, err)
		return
	}
	// The upload target gets its serving certificate (or is refused).
	issued := poll(2*time.Minute, time.Second, func() bool { return len(certsIn(t, a)) > 0 })
	time.Sleep(5 * time.Second)
	found := certsIn(t, a)
	if !issued {
		t.Logf("%s: no certificate in %s after 2 minutes; the claim says: %s", route, a, eventsAbout(a, name))
	}
	for secret, list := range found {
		for _, c := range list {
			t.Logf("%s: Secret %s/%s: CN %q issuer %q DNS names %v", route, a, secret, c.Subject.CommonName, c.Issuer.CommonName, c.DNSNames)
			for _, dns := range c.DNSNames {
				if namesNamespace(dns, b) {
					t.Errorf("%s: Secret %s/%s holds a certificate from %q valid for %s, a name in namespace %s", route, a, secret, c.Issuer.CommonName, dns, b)
				}
				if !strings.HasSuffix(dns, "."+a+".svc") && !strings.HasSuffix(dns, "."+a+".svc.cluster.local") {
					t.Errorf("%s: Secret %s/%s: DNS name %s is not <service>.%s.svc[.cluster.local]", route, a, secret, dns, a)
				} else if svc := strings.Split(dns, ".")[0]; len(svc) > 63 {
					t.Errorf("%s: Secret %s/%s: service name %s is no DNS-1035 label", route, a, secret, svc)
				}
			}
		}
	}
}

// TestTenancyViewerClone is H6: a user with edit in A and only view in B
// may not clone B's claim (view grants no datavolumes/source since CDI
// #4219): refused naming the permission, no byte of B in A.
func TestTenancyViewerClone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := tenancyNamespaces(t)
	u := newTenant(t)
	bind(t, a, "edit", u.subject(), u.info())
	bind(t, b, "view", u.subject(), u.info())
	mark, _ := markedClaim(t, b, "secret-disk", "")
	const route = "H6 a viewer of B clones from B"
	if err := u.c.List(ctx, &cdiv1.DataVolumeList{}, client.InNamespace(b)); err != nil {
		t.Fatalf("the viewer may not list B's DataVolumes: %v", err)
	}
	if !refused(t, route, u.c.Create(ctx, cloneDataVolume(a, "from-b", b, "secret-disk")), "datavolumes/source", b, u.name) {
		t.Logf("%s: the clone ended %s", route, settle(a, "from-b", tenancyWait))
	}
	noMarker(t, route, a, mark, "B")
}

// TestTenancyCrossNamespaceClone is the authorised clone: edit in A and
// clone-sourcer in B. A host-assisted clone carries every byte; its pods,
// in B, are not kept there although the target asks to retain pods (U3:
// CDI never retains pods in a namespace the requester may not use); and no
// worker pod in A or B carries a ServiceAccount token (U4).
func TestTenancyCrossNamespaceClone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := tenancyNamespaces(t)
	u := newTenant(t)
	bind(t, a, "edit", u.subject(), u.info())
	bind(t, b, cloneSourcerRole, u.subject(), u.info())
	class := cloneClass(t, kc, cdiv1.CloneStrategyHostAssisted, "", "")
	mark, sum := markedClaim(t, b, "golden", class)
	workers := watchWorkerPods(t, snapClient(t), a, b)

	dv := kit.DataVolume(a, "copy", &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: b, Name: "golden"}}, kit.WithStorage(class, claimSize))
	dv.Annotations = map[string]string{cdiv1.AnnPodRetainAfterCompletion: "true"}
	if err := u.c.Create(ctx, dv); err != nil {
		t.Fatalf("a clone by a user bound to %s in %s was refused: %v", cloneSourcerRole, b, err)
	}
	waitSucceeded(t, a, "copy", tenancyWait)
	if got := readBack(t, a, "copy", markedMiB<<20); got != sum {
		t.Errorf("the clone hashes %s, its source %s", got, sum)
	}
	hasMarker(t, "authorised cross-namespace clone", a, "copy", mark)

	var left []string
	poll(time.Minute, 2*time.Second, func() bool {
		left = nil
		pods := &corev1.PodList{}
		_ = kc.List(ctx, pods, client.InNamespace(b), client.MatchingLabels{cdiv1.LabelApp: cdiv1.LabelAppValue})
		for _, p := range pods.Items {
			left = append(left, p.Name)
		}
		return len(left) == 0
	})
	if len(left) > 0 {
		t.Errorf("U3: the clone's pods %v are kept in the source namespace %s because the target asked to retain pods", left, b)
	}
	checkWorkerPods(t, workers, "clone-source", "upload-server")
}

// checkWorkerPods fails the test for every worker pod seen that carries a
// ServiceAccount token (U4), and when a component expected was never seen.
func checkWorkerPods(t *testing.T, w *workerPods, components ...string) {
	t.Helper()
	seen := map[string]bool{}
	for _, p := range w.list() {
		comp := p.Labels[cdiv1.LabelComponent]
		seen[comp] = true
		if why := tokenMount(&p); why != "" {
			t.Errorf("U4: worker pod %s/%s (%s) carries its ServiceAccount's token: %s", p.Namespace, p.Name, comp, why)
		} else {
			t.Logf("U4: worker pod %s/%s (%s) mounts no ServiceAccount token", p.Namespace, p.Name, comp)
		}
	}
	for _, c := range components {
		if !seen[c] {
			t.Errorf("U4: no %s pod was seen", c)
		}
	}
}

// TestTenancyWorkerPodsNoToken is U4 for the importer and the upload
// server of a tenant's own namespace.
func TestTenancyWorkerPodsNoToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := testNamespace(t, "tenancy-a")
	workers := watchWorkerPods(t, snapClient(t), a)
	dir := t.TempDir()
	testDisk(t, dir, 8<<20)
	srv := throttledServer(t, dir, 4<<20)
	if err := kc.Create(ctx, kit.DataVolume(a, "imported", kit.HTTP(srv+"/disk.raw"), kit.WithStorage("", claimSize))); err != nil {
		t.Fatal(err)
	}
	if err := kc.Create(ctx, kit.DataVolume(a, "waiting", kit.Upload(), kit.WithStorage("", claimSize))); err != nil {
		t.Fatal(err)
	}
	waitSucceeded(t, a, "imported", tenancyWait)
	kit.WaitDataVolume(t, kc, a, "waiting", 3*time.Minute, func(dv *cdiv1.DataVolume) bool { return dv.Status.Phase == cdiv1.UploadReady })
	uploadPodURL(t, a)
	checkWorkerPods(t, workers, "importer", "upload-server")
}

// TestTenancyUploadWithToken is the authorised upload: the tenant requests
// a token for her own upload and sends her bytes through the installed
// proxy; she gets no token for B's.
func TestTenancyUploadWithToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := tenancyNamespaces(t)
	u := newTenant(t)
	bind(t, a, "edit", u.subject(), u.info())
	if err := u.c.Create(ctx, kit.DataVolume(a, "upload-me", kit.Upload(), kit.WithStorage("", claimSize))); err != nil {
		t.Fatal(err)
	}
	if err := kc.Create(ctx, kit.DataVolume(b, "victim", kit.Upload(), kit.WithStorage("", claimSize))); err != nil {
		t.Fatal(err)
	}
	kit.WaitDataVolume(t, kc, a, "upload-me", 3*time.Minute, func(dv *cdiv1.DataVolume) bool { return dv.Status.Phase == cdiv1.UploadReady })

	other := &uploadv1.UploadTokenRequest{ObjectMeta: metav1.ObjectMeta{Namespace: b, Name: "steal"}, Spec: uploadv1.UploadTokenRequestSpec{PvcName: "victim"}}
	err := u.c.Create(ctx, other)
	if refused(t, "upload token for B", err, "uploadtokenrequests") && !apierrors.IsForbidden(err) {
		t.Errorf("upload token for B: %v, want Forbidden", err)
	}

	tr := &uploadv1.UploadTokenRequest{ObjectMeta: metav1.ObjectMeta{Namespace: a, Name: "mine"}, Spec: uploadv1.UploadTokenRequestSpec{PvcName: "upload-me"}}
	if err := u.c.Create(ctx, tr); err != nil {
		t.Fatalf("the tenant's token request for her own upload: %v", err)
	}
	if tr.Status.Token == "" {
		t.Fatal("the token request came back without a token")
	}
	data, mark, sum := markedImage()
	ca := &corev1.ConfigMap{}
	if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.BundleName(certs.UploadProxySigner)}, ca); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(ca.Data[certs.BundleKey]))
	hc := &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	proxy := "https://" + net.JoinHostPort(serviceIP(t, installNS, certs.DefaultUploadProxyService), "443")
	req, _ := http.NewRequest(http.MethodPost, proxy+"/v1beta1/upload", bytes.NewReader(data))
	req.Header.Set("Authorization", "Bearer "+tr.Status.Token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("upload through the installed proxy: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("upload through the installed proxy: %d %s", resp.StatusCode, body)
	}
	waitSucceeded(t, a, "upload-me", 2*time.Minute)
	if got := readBack(t, a, "upload-me", len(data)); got != sum {
		t.Errorf("the upload hashes %s, the bytes sent %s", got, sum)
	}
	hasMarker(t, "authorised upload", a, "upload-me", mark)
	noMarker(t, "authorised upload", b, mark, "A")
}
