package clone

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/pkg/populators"
)

// hostFlow is a cross-namespace host-assisted clone of golden/src into
// tgt/disk, its prime tmp-pvc-u1 in golden, with a fake API.
func hostFlow(t *testing.T, primeAnn map[string]string, objs ...client.Object) (*populators.Flow, *sourceWorker, client.Client) {
	t.Helper()
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(cdiv1.AddToScheme(s))
	target := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "tgt", Name: "disk", UID: "u1",
		Annotations: map[string]string{cdiv1.AnnDataSourceNamespace: "golden"}},
		Spec: corev1.PersistentVolumeClaimSpec{DataSourceRef: &corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeCloneSourceRef, Name: "vcs"}}}
	prime := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "golden", Name: TmpClaimName("u1"), Annotations: primeAnn,
		Labels: map[string]string{cdiv1.LabelOwnedByUID: "u1"}}}
	vcs := &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: "golden", Name: "vcs"},
		Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(append([]client.Object{target, prime, vcs}, objs...)...).Build()
	k := &Kind{Client: c, Namespace: "kubefill-system"}
	return &populators.Flow{Target: target, Prime: prime, Source: vcs, Client: c}, &sourceWorker{run: &run{k: k}}, c
}

func secretCert(t *testing.T, c client.Client) (*x509.Certificate, *corev1.Secret) {
	t.Helper()
	sec := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "golden", Name: SourcePodName("u1")}, sec); err != nil {
		t.Fatal(err)
	}
	cert := certs.ParseLeaf(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if cert == nil {
		t.Fatal("the Secret holds no certificate and key")
	}
	return cert, sec
}

// TestClientCertNameIsComputed (H3): the source pod's certificate names the
// clone as the controller computes it, whatever the prime's annotation
// says; it comes from the clone signer, lives hours, and the upload server
// of the clone requires that very name.
func TestClientCertNameIsComputed(t *testing.T) {
	ctx := context.Background()
	f, w, c := hostFlow(t, map[string]string{cdiv1.AnnUploadClientName: certs.UploadServerClientName})
	want := "golden/src-golden/tmp-pvc-u1"
	if got, err := cloneClientName(f); err != nil || got != want {
		t.Fatalf("cloneClientName = %q, %v; want %q", got, err, want)
	}
	if err := w.ensureClientCert(ctx, f, SourcePodName("u1")); err != nil {
		t.Fatal(err)
	}
	cert, sec := secretCert(t, c)
	if cert.Subject.CommonName != want {
		t.Errorf("client certificate CN %q, want %q (the prime said %q)", cert.Subject.CommonName, want, certs.UploadServerClientName)
	}
	if left := time.Until(cert.NotAfter); left > certs.CloneClientValidity+time.Minute {
		t.Errorf("client certificate valid for %s, more than %s", left, certs.CloneClientValidity)
	}
	clone, proxy := &corev1.Secret{}, &corev1.Secret{}
	for name, s := range map[string]*corev1.Secret{certs.CloneClientSigner: clone, certs.UploadServerClientSigner: proxy} {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "kubefill-system", Name: name}, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := cert.CheckSignatureFrom(certs.ParseBundle(clone.Data[corev1.TLSCertKey])[0]); err != nil {
		t.Errorf("not signed by the clone client signer: %v", err)
	}
	if err := cert.CheckSignatureFrom(certs.ParseBundle(proxy.Data[corev1.TLSCertKey])[0]); err == nil {
		t.Error("signed by the upload proxy's client signer")
	}
	if len(sec.Data["ca.crt"]) == 0 {
		t.Error("no upload-server bundle (ca.crt) for the source pod")
	}
	// The upload server is told the same name.
	spec, err := (&populators.UploadServer{Client: c, ClientName: cloneClientName}).WorkerSpec(ctx, f, &cdiv1.CDIConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if args := spec.Container.Args; !containsPair(args, "--client-name", want) {
		t.Errorf("upload server args %v lack --client-name %s", args, want)
	}

	// A fresh certificate is kept; editing the prime changes nothing.
	f.Prime.Annotations[cdiv1.AnnUploadClientName] = "tgt/x-golden/tmp-pvc-u2"
	if err := w.ensureClientCert(ctx, f, SourcePodName("u1")); err != nil {
		t.Fatal(err)
	}
	if again, _ := secretCert(t, c); !again.Equal(cert) {
		t.Error("a fresh certificate was issued again")
	}
}

// TestClientCertReissued: a Secret holding a certificate the clone's upload
// server would refuse or that is near its end (one from the proxy's
// signer, as Kubefill issued them before; another name; hours from
// expiry) gets a new one.
func TestClientCertReissued(t *testing.T) {
	ctx := context.Background()
	want := "golden/src-golden/tmp-pvc-u1"
	f, w, c := hostFlow(t, nil)
	u, err := populators.LoadUploadPKI(ctx, c, c, "kubefill-system")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(sg *certs.Signer, cn string, validity time.Duration) {
		t.Helper()
		crt, key, err := sg.CA.Issue(cn, nil, true, validity)
		if err != nil {
			t.Fatal(err)
		}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "golden", Name: SourcePodName("u1")}}
		if err := c.Get(ctx, client.ObjectKeyFromObject(sec), sec); err != nil {
			sec.Data = map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}
			if err := c.Create(ctx, sec); err != nil {
				t.Fatal(err)
			}
			return
		}
		sec.Data = map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, "ca.crt": u.ServerBundle}
		if err := c.Update(ctx, sec); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		sg   *certs.Signer
		cn   string
		life time.Duration
	}{
		{"the proxy's signer, 30 days", u.ClientSigner, want, 30 * 24 * time.Hour},
		{"the proxy's name", u.CloneSigner, certs.UploadServerClientName, time.Hour * 12},
		{"near its end", u.CloneSigner, want, time.Hour},
	} {
		issue(tc.sg, tc.cn, tc.life)
		if err := w.ensureClientCert(ctx, f, SourcePodName("u1")); err != nil {
			t.Fatal(err)
		}
		cert, _ := secretCert(t, c)
		if d := certs.DecideCloneClient(time.Now(), cert, want, certs.ParseBundle(u.CloneBundle)); d.Renew {
			t.Errorf("%s: not issued again (%s)", tc.name, d.Reason)
		}
	}
}

func containsPair(args []string, flag, value string) bool {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag && args[i+1] == value {
			return true
		}
	}
	return false
}

func TestSourcePodNameFromPrimeName(t *testing.T) {
	w := &sourceWorker{}
	prime := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: TmpClaimName("u1"), Labels: map[string]string{cdiv1.LabelOwnedByUID: "u2"}}}
	if got := w.PodName(prime); got != "u1-source-pod" {
		t.Errorf("PodName = %q, want u1-source-pod (from the prime's name, not its edited label)", got)
	}
	if got := TargetOfTmpClaim("prime-u1"); got != "" {
		t.Errorf("TargetOfTmpClaim(prime-u1) = %q", got)
	}
}
