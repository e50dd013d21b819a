package uploadcli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	uploadv1 "github.com/kubefill/kubefill-api/upload/v1beta1"
	"github.com/kubefill/kubefill/pkg/uploadproxy"
)

// TokenGenerateName is the generateName of the UploadTokenRequests, as virtctl's.
const TokenGenerateName = "token-for-virtctl-"

// Runner carries out an upload against a cluster.
type Runner struct {
	Opts   Options
	Config *rest.Config
	Client client.Client
	// Out receives progress, spinners and messages (stderr).
	Out io.Writer
	// Poll is the interval of the readiness and completion checks; 2 s if zero.
	Poll time.Duration
}

// NewRunner builds the clients from cfg.
func NewRunner(cfg *rest.Config, opts Options, out io.Writer) (*Runner, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, cdiv1.AddToScheme, uploadv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("building the Kubernetes client: %w", err)
	}
	return &Runner{Opts: opts, Config: cfg, Client: c, Out: out}, nil
}

func (r *Runner) printf(format string, args ...any) { fmt.Fprintf(r.Out, format+"\n", args...) }

func (r *Runner) poll() time.Duration {
	if r.Poll > 0 {
		return r.Poll
	}
	return 2 * time.Second
}

// Run creates (unless --no-create) the object, waits for the upload pod,
// uploads, and waits for the data to be processed.
func (r *Runner) Run(ctx context.Context) error {
	o := &r.Opts
	if err := o.Validate(); err != nil {
		return err
	}
	fi, err := os.Stat(o.Path())
	if err != nil {
		return fmt.Errorf("the file to upload: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", o.Path())
	}
	proxyURL := o.ProxyURL
	if proxyURL != "" {
		proxyURL, _ = NormalizeProxyURL(proxyURL)
	} else {
		var cfg cdiv1.CDIConfig
		if err := r.Client.Get(ctx, types.NamespacedName{Name: "config"}, &cfg); err != nil {
			return fmt.Errorf("reading CDIConfig \"config\" for the upload proxy URL (or pass --uploadproxy-url): %w", err)
		}
		if proxyURL, err = ProxyURLFromConfig(&cfg); err != nil {
			return err
		}
	}
	httpc, err := NewHTTPClient(o.Insecure, o.CACert)
	if err != nil {
		return err
	}
	if o.NoCreate {
		if err := r.checkExisting(ctx); err != nil {
			return err
		}
	} else if err := r.create(ctx); err != nil {
		return err
	}
	if err := r.waitReady(ctx); err != nil {
		return err
	}
	up := &Uploader{
		Client: httpc, ProxyURL: proxyURL, Retry: o.Retry,
		Token:    r.token,
		Progress: NewProgress(r.Out),
		Log:      func(f string, a ...any) { r.printf(f, a...) },
	}
	path := UploadPath(o.Archive(), up.ProbeAsync(ctx))
	r.printf("uploading %s (%d bytes) to %s%s", o.Path(), fi.Size(), proxyURL, path)
	start := time.Now()
	body, err := up.Upload(ctx, path, o.Path())
	if err != nil {
		return err
	}
	secs := time.Since(start).Seconds()
	r.printf("uploaded %d bytes in %.1fs (%.1f MiB/s): %s", fi.Size(), secs, float64(fi.Size())/(1<<20)/secs, body)
	return r.waitDone(ctx)
}

func (r *Runner) key() types.NamespacedName {
	return types.NamespacedName{Namespace: r.Opts.Namespace, Name: r.Opts.Name}
}

func (r *Runner) create(ctx context.Context) error {
	o := &r.Opts
	switch o.Kind {
	case KindDataVolume:
		dv, err := o.DataVolume()
		if err != nil {
			return err
		}
		if err := r.Client.Create(ctx, dv); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("DataVolume %s already exists; pass --no-create to upload into it", r.key())
			}
			return fmt.Errorf("creating DataVolume %s: %w", r.key(), err)
		}
		r.printf("DataVolume %s created", r.key())
	case KindPVC:
		pvc, src, err := o.PVC()
		if err != nil {
			return err
		}
		if err := r.Client.Create(ctx, src); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating VolumeUploadSource %s: %w", r.key(), err)
		}
		if err := r.Client.Create(ctx, pvc); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("PersistentVolumeClaim %s already exists; pass --no-create to upload into it", r.key())
			}
			return fmt.Errorf("creating PersistentVolumeClaim %s: %w", r.key(), err)
		}
		r.printf("PersistentVolumeClaim %s created, with VolumeUploadSource %s", r.key(), o.Name)
	}
	return nil
}

func (r *Runner) checkExisting(ctx context.Context) error {
	if r.Opts.Kind == KindDataVolume {
		var dv cdiv1.DataVolume
		if err := r.Client.Get(ctx, r.key(), &dv); err != nil {
			return fmt.Errorf("--no-create: reading DataVolume %s: %w", r.key(), err)
		}
		if dv.Spec.Source == nil || dv.Spec.Source.Upload == nil {
			return fmt.Errorf("DataVolume %s has no source.upload: it does not accept uploads", r.key())
		}
		if dv.Status.Phase == cdiv1.Succeeded {
			return fmt.Errorf("DataVolume %s already succeeded: it received its upload", r.key())
		}
		return nil
	}
	var pvc corev1.PersistentVolumeClaim
	if err := r.Client.Get(ctx, r.key(), &pvc); err != nil {
		return fmt.Errorf("--no-create: reading PersistentVolumeClaim %s: %w", r.key(), err)
	}
	return nil
}

// waitReady waits for storage.pod.ready on the claim or its prime.
func (r *Runner) waitReady(ctx context.Context) error {
	sp := NewSpinner(r.Out, "waiting for the upload pod of "+r.key().String())
	defer sp.Stop()
	deadline := time.Now().Add(r.Opts.Wait())
	for {
		d, err := r.decide(ctx)
		if err != nil {
			return err
		}
		switch d.State {
		case uploadproxy.TargetReady:
			return nil
		case uploadproxy.TargetCompleted, uploadproxy.TargetInvalid:
			return errors.New(d.Reason)
		}
		sp.Describe("waiting: " + d.Reason)
		if time.Now().After(deadline) {
			return fmt.Errorf("the upload pod was not ready within --wait-secs=%d: %s", r.Opts.WaitSecs, d.Reason)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(r.poll()):
		}
	}
}

func (r *Runner) decide(ctx context.Context) (uploadproxy.Decision, error) {
	var pvc corev1.PersistentVolumeClaim
	if err := r.Client.Get(ctx, r.key(), &pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return uploadproxy.Decision{State: uploadproxy.TargetWaiting, Reason: "PersistentVolumeClaim " + r.key().String() + " does not exist yet"}, nil
		}
		return uploadproxy.Decision{}, fmt.Errorf("reading PersistentVolumeClaim %s: %w", r.key(), err)
	}
	var prime *corev1.PersistentVolumeClaim
	if name := pvc.Annotations[cdiv1.AnnPVCPrimeName]; name != "" {
		var p corev1.PersistentVolumeClaim
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: pvc.Namespace, Name: name}, &p)
		switch {
		case err == nil:
			prime = &p
		case !apierrors.IsNotFound(err):
			return uploadproxy.Decision{}, fmt.Errorf("reading PVC-prime %s/%s: %w", pvc.Namespace, name, err)
		}
	}
	return uploadproxy.DecideTarget(&pvc, prime), nil
}

// token creates an UploadTokenRequest and returns its token.
func (r *Runner) token(ctx context.Context) (string, error) {
	return RequestToken(ctx, r.Config, r.Opts.Namespace, r.Opts.Name)
}

// RequestToken POSTs an UploadTokenRequest for the claim namespace/name to the API.
func RequestToken(ctx context.Context, cfg *rest.Config, namespace, name string) (string, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return "", err
	}
	req := uploadv1.UploadTokenRequest{
		TypeMeta:   metav1.TypeMeta{APIVersion: uploadv1.SchemeGroupVersion.String(), Kind: "UploadTokenRequest"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: TokenGenerateName, Namespace: namespace},
		Spec:       uploadv1.UploadTokenRequestSpec{PvcName: name},
	}
	b, err := json.Marshal(req)
	if err != nil {
		return "", err
	}
	host := strings.TrimSuffix(cfg.Host, "/")
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	u := host + "/apis/" + uploadv1.GroupName + "/v1beta1/namespaces/" + namespace + "/uploadtokenrequests"
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(b))
	if err != nil {
		return "", err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "application/json")
	resp, err := hc.Do(hr)
	if err != nil {
		return "", fmt.Errorf("creating an UploadTokenRequest: %w", err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		var st metav1.Status
		if json.Unmarshal(rb, &st) == nil && st.Message != "" {
			return "", fmt.Errorf("creating an UploadTokenRequest for %s/%s: %d: %s", namespace, name, resp.StatusCode, st.Message)
		}
		return "", fmt.Errorf("creating an UploadTokenRequest for %s/%s: %d: %s", namespace, name, resp.StatusCode, strings.TrimSpace(string(rb)))
	}
	var out uploadv1.UploadTokenRequest
	if err := json.Unmarshal(rb, &out); err != nil {
		return "", fmt.Errorf("decoding the UploadTokenRequest answer: %w", err)
	}
	if out.Status.Token == "" {
		return "", errors.New("the UploadTokenRequest answer carries no status.token")
	}
	return out.Status.Token, nil
}

// waitDone waits for the DataVolume to succeed, or the claim's population to finish.
func (r *Runner) waitDone(ctx context.Context) error {
	sp := NewSpinner(r.Out, "processing "+r.key().String())
	defer sp.Stop()
	deadline := time.Now().Add(r.Opts.Wait())
	for {
		done, what, err := r.done(ctx)
		if err != nil {
			return err
		}
		if done {
			sp.Stop()
			r.printf("%s", what)
			return nil
		}
		sp.Describe(what)
		if time.Now().After(deadline) {
			return fmt.Errorf("the upload was received but processing did not finish within --wait-secs=%d: %s", r.Opts.WaitSecs, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(r.poll()):
		}
	}
}

func (r *Runner) done(ctx context.Context) (bool, string, error) {
	if r.Opts.Kind == KindDataVolume {
		var dv cdiv1.DataVolume
		if err := r.Client.Get(ctx, r.key(), &dv); err != nil {
			return false, "", fmt.Errorf("reading DataVolume %s: %w", r.key(), err)
		}
		return DataVolumeDone(&dv)
	}
	var pvc corev1.PersistentVolumeClaim
	if err := r.Client.Get(ctx, r.key(), &pvc); err != nil {
		return false, "", fmt.Errorf("reading PersistentVolumeClaim %s: %w", r.key(), err)
	}
	return PVCDone(&pvc), pvcState(&pvc), nil
}

// DataVolumeDone says whether the DataVolume finished, and describes its state.
func DataVolumeDone(dv *cdiv1.DataVolume) (bool, string, error) {
	where := dv.Namespace + "/" + dv.Name
	switch dv.Status.Phase {
	case cdiv1.Succeeded:
		return true, fmt.Sprintf("DataVolume %s succeeded", where), nil
	case cdiv1.Failed:
		return false, "", fmt.Errorf("DataVolume %s failed: %s", where, conditionMessage(dv))
	}
	return false, fmt.Sprintf("DataVolume %s is %s (%s)", where, orUnset(string(dv.Status.Phase)), orUnset(string(dv.Status.Progress))), nil
}

// PVCDone says whether a claim's upload has been written and handed over.
func PVCDone(pvc *corev1.PersistentVolumeClaim) bool {
	if cdiv1.IsCompleted(pvc) {
		return true
	}
	// A populated claim is bound only once the prime's volume was handed to it.
	return pvc.Spec.DataSourceRef != nil && pvc.Status.Phase == corev1.ClaimBound
}

func pvcState(pvc *corev1.PersistentVolumeClaim) string {
	where := pvc.Namespace + "/" + pvc.Name
	if PVCDone(pvc) {
		return fmt.Sprintf("PersistentVolumeClaim %s is populated", where)
	}
	return fmt.Sprintf("PersistentVolumeClaim %s is %s, upload pod %s", where, orUnset(string(pvc.Status.Phase)), orUnset(pvc.Annotations[cdiv1.AnnPodPhase]))
}

func conditionMessage(dv *cdiv1.DataVolume) string {
	for _, c := range dv.Status.Conditions {
		if c.Message != "" && c.Status != corev1.ConditionTrue {
			return c.Message
		}
	}
	return "no condition says why"
}

func orUnset(s string) string {
	if s == "" {
		return "unset"
	}
	return s
}
