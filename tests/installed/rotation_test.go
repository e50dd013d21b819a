package installed

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"
	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/tests/kit"
)

// TestInstalledRotation shortens the CDI resource's certConfig to a minute
// (CAs and leaves of 3m renewed after 1m, so that a replaced certificate
// stays valid the two minutes kubelet may take to update a pod's Secret
// volume) and, while every
// chain of the installed components rotates twice, keeps asking for upload
// tokens through kube-apiserver's aggregator (APIService caBundle), creating
// DataVolumes in dry-run mode (both webhooks, their caBundle) and uploading
// with virtctl through the installed proxy: none may fail. The pods are
// never restarted; they re-read the rotated Secret files.
func TestInstalledRotation(t *testing.T) {
	bin := os.Getenv("KUBEFILL_VIRTCTL")
	if bin == "" {
		t.Skip("KUBEFILL_VIRTCTL is not set (hack/virtctl.sh builds KubeVirt's virtctl)")
	}
	ctx := context.Background()
	ns := "installed-rotation"
	if err := kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	// Gone after the test, as every test's namespace is: tests/load runs on
	// this cluster next.
	t.Cleanup(func() {
		_ = kc.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	restarts := func() map[string]int32 {
		pods := &corev1.PodList{}
		if err := kc.List(ctx, pods, client.InNamespace(installNS)); err != nil {
			t.Fatal(err)
		}
		out := map[string]int32{}
		for _, p := range pods.Items {
			for _, s := range p.Status.ContainerStatuses {
				out[p.Name] += s.RestartCount
			}
		}
		return out
	}
	before := restarts()
	signerCert := func(name string) []byte {
		s := &corev1.Secret{}
		if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: name}, s); err != nil {
			t.Fatal(err)
		}
		return s.Data[corev1.TLSCertKey]
	}
	signers := []string{certs.APIServerSigner, certs.UploadProxySigner, certs.UploadServerSigner, certs.UploadServerClientSigner, certs.CloneClientSigner}
	first := map[string][]byte{}
	for _, s := range signers {
		first[s] = signerCert(s)
	}

	// An upload DataVolume to ask tokens for.
	target := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "token-target"},
		Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}, Storage: storageSpec("16Mi")}}
	if err := kc.Create(ctx, target); err != nil {
		t.Fatal(err)
	}
	var calls, failures atomic.Int64
	var mu sync.Mutex
	var failed []string
	fail := func(what string, err error) {
		failures.Add(1)
		mu.Lock()
		failed = append(failed, time.Now().Format("15:04:05")+" "+what+": "+err.Error())
		mu.Unlock()
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			calls.Add(1)
			tr := &uploadv1.UploadTokenRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("tok-%d", i)},
				Spec: uploadv1.UploadTokenRequestSpec{PvcName: target.Name}}
			if err := kc.Create(ctx, tr); err != nil {
				fail("UploadTokenRequest through the aggregator", err)
			} else if tr.Status.Token == "" {
				fail("UploadTokenRequest", fmt.Errorf("no token in the answer"))
			}
			dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("dry-%d", i)},
				Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, Storage: storageSpec("16Mi")}}
			if err := kc.Create(ctx, dv, client.DryRunAll); err != nil {
				fail("DataVolume create (dry run) through the webhooks", err)
			}
		}
	}()

	cr := &cdiv1.CDI{}
	if err := kc.Get(ctx, types.NamespacedName{Name: "cdi"}, cr); err != nil {
		t.Fatal(err)
	}
	d := func(s string) *metav1.Duration { v, _ := time.ParseDuration(s); return &metav1.Duration{Duration: v} }
	cr.Spec.CertConfig = &cdiv1.CDICertConfig{
		CA:     &cdiv1.CertConfig{Duration: d("3m"), RenewBefore: d("2m")},
		Server: &cdiv1.CertConfig{Duration: d("3m"), RenewBefore: d("2m")},
		Client: &cdiv1.CertConfig{Duration: d("3m"), RenewBefore: d("2m")},
	}
	if err := kc.Update(ctx, cr); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	upload := func(name string) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
		defer cancel()
		dir := t.TempDir()
		disk, _ := testDisk(t, dir, 4<<20)
		proxySvc := &corev1.Service{}
		if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.DefaultUploadProxyService}, proxySvc); err != nil {
			t.Fatal(err)
		}
		out, err := exec.CommandContext(cctx, bin, "image-upload", "dv", name, "--namespace="+ns, "--size=32Mi", "--image-path="+disk,
			"--uploadproxy-url=https://"+proxySvc.Spec.ClusterIP+":443", "--insecure", "--wait-secs=180", "--kubeconfig="+cl.Kubeconfig).CombinedOutput()
		if err != nil {
			t.Errorf("virtctl image-upload %s: %v\n%s", name, err, lastLines(string(out), 10))
			return
		}
		waitSucceeded(t, ns, name, 2*time.Minute)
		t.Logf("virtctl image-upload %s through the installed proxy: Succeeded", name)
	}
	// Three generations after the first: the config change replaces every
	// certificate at once, then each signer is renewed a minute later, twice.
	prev := first
	for gen := 1; gen <= 3; gen++ {
		kit.Until(t, 3*time.Minute, fmt.Sprintf("generation %d of every signer", gen), func() bool {
			for _, s := range signers {
				if bytes.Equal(signerCert(s), prev[s]) {
					return false
				}
			}
			return true
		})
		cur := map[string][]byte{}
		for _, s := range signers {
			cur[s] = signerCert(s)
		}
		bundle := &corev1.ConfigMap{}
		if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: certs.BundleName(certs.APIServerSigner)}, bundle); err != nil {
			t.Fatal(err)
		}
		t.Logf("generation %d of the signers after %s; %s holds %d CAs; %d calls so far, %d failed", gen, time.Since(start).Round(time.Second),
			certs.BundleName(certs.APIServerSigner), strings.Count(bundle.Data[certs.BundleKey], "BEGIN CERTIFICATE"), calls.Load(), failures.Load())
		upload(fmt.Sprintf("upload-gen-%d", gen))
		prev = cur
	}
	close(stop)
	<-done
	t.Logf("%d rounds of an upload token request and a dry-run DataVolume across the rotations, %d failed", calls.Load(), failures.Load())
	if failures.Load() > 0 {
		t.Errorf("calls failed across the rotations:\n%s", strings.Join(failed, "\n"))
	}
	if calls.Load() < 60 {
		t.Errorf("only %d rounds of calls", calls.Load())
	}
	after := restarts()
	for pod, n := range after {
		if n != before[pod] {
			t.Errorf("pod %s restarted during the rotations (%d -> %d)", pod, before[pod], n)
		}
	}
	// Back to CDI's defaults for whatever runs next.
	if err := kc.Get(ctx, types.NamespacedName{Name: "cdi"}, cr); err == nil {
		cr.Spec.CertConfig = nil
		_ = kc.Update(ctx, cr)
	}
}
