package certs

import (
	"context"
	"fmt"
	"net"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// Default Service names the serving certificates are for.
const (
	DefaultAPIServerService   = "kubefill-api"
	DefaultUploadProxyService = "kubefill-uploadproxy"
	// DefaultPoll is how often the chains are checked at the latest, as CDI's operator.
	DefaultPoll = time.Minute
)

// Rotator keeps the chains. Sync does one pass.
type Rotator struct {
	Store
	// APIServer keeps the API server's chain and injects its bundle. Off
	// when something else (cert-manager) issues the API server's certificate.
	APIServer bool
	// APIServerService and UploadProxyService are the Services the serving
	// certificates name; empty are the defaults.
	APIServerService, UploadProxyService string
}

func (r *Rotator) apiService() string {
	if r.APIServerService != "" {
		return r.APIServerService
	}
	return DefaultAPIServerService
}

func (r *Rotator) proxyService() string {
	if r.UploadProxyService != "" {
		return r.UploadProxyService
	}
	return DefaultUploadProxyService
}

// Sync brings every chain up to date at now under settings and returns
// when it next needs to run.
func (r *Rotator) Sync(ctx context.Context, s Settings, now time.Time) (time.Time, error) {
	logger := log.FromContext(ctx)
	next := time.Time{}
	soonest := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	// signer brings a signer and its bundle up to date.
	signer := func(name string) (*Signer, []byte, error) {
		sg, d, err := r.EnsureSigner(ctx, name, s.CA, now, true)
		if err != nil {
			return nil, nil, err
		}
		if d.Renew {
			logger.Info("certificate rotated", "secret", name, "reason", d.Reason, "notAfter", sg.Cert.NotAfter)
		}
		soonest(d.RefreshAt)
		if d.Renew {
			soonest(sg.Cert.NotAfter.Add(-s.CA.RenewBefore()))
		}
		bundle, expiry, err := r.EnsureBundle(ctx, name, sg.Cert, now)
		if err != nil {
			return nil, nil, err
		}
		soonest(expiry)
		return sg, bundle, nil
	}
	leafOf := func(l leaf, sg *Signer, cfg Lifetime, hosts []string, extra map[string][]byte) error {
		d, err := r.EnsureLeaf(ctx, l, sg, cfg, hosts, extra, now, true)
		if err != nil {
			return err
		}
		if d.Renew {
			logger.Info("certificate rotated", "secret", l.secret, "reason", d.Reason)
			soonest(now.Add(cfg.Refresh.Duration))
		}
		soonest(d.RefreshAt)
		return nil
	}

	if r.APIServer {
		sg, bundle, err := signer(APIServerSigner)
		if err != nil {
			return next, err
		}
		// The bundle goes in before a leaf of a new signer is issued, so
		// that kube-apiserver trusts the new CA before any server uses it.
		svc := r.apiService()
		n, err := InjectCABundle(ctx, r.Client, r.reader(), r.Namespace, svc, bundle)
		if err != nil {
			return next, err
		}
		if n > 0 {
			logger.Info("injected the API server's CA bundle", "objects", n, "service", r.Namespace+"/"+svc)
		}
		if err := leafOf(leaf{secret: APIServerServerCert, commonName: svc + "." + r.Namespace + ".svc"}, sg, s.Server, ServiceHosts(svc, r.Namespace), nil); err != nil {
			return next, err
		}
	}

	sg, _, err := signer(UploadProxySigner)
	if err != nil {
		return next, err
	}
	proxy := r.proxyService()
	hosts, err := r.serviceHosts(ctx, proxy)
	if err != nil {
		return next, err
	}
	if err := leafOf(leaf{secret: UploadProxyServerCert, commonName: proxy + "." + r.Namespace + ".svc"}, sg, s.Server, hosts, nil); err != nil {
		return next, err
	}

	_, serverBundle, err := signer(UploadServerSigner)
	if err != nil {
		return next, err
	}
	clientSigner, _, err := signer(UploadServerClientSigner)
	if err != nil {
		return next, err
	}
	if err := leafOf(leaf{secret: UploadServerClientCert, commonName: UploadServerClientName, client: true}, clientSigner, s.Client, nil,
		map[string][]byte{ClientCertCAKey: serverBundle}); err != nil {
		return next, err
	}
	// The clone signer's leaves are the clone populator's (IssueCloneClient),
	// short-lived and issued per clone; the signer and its bundle are kept
	// here like the others.
	if _, _, err := signer(CloneClientSigner); err != nil {
		return next, err
	}
	return next, nil
}

// serviceHosts are a Service's names plus its cluster IPs when it exists,
// so that clients reaching the upload proxy by address verify it too.
func (r *Rotator) serviceHosts(ctx context.Context, name string) ([]string, error) {
	hosts := ServiceHosts(name, r.Namespace)
	svc := &corev1.Service{}
	err := r.reader().Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: name}, svc)
	if apierrors.IsNotFound(err) {
		return hosts, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading Service %s/%s: %w", r.Namespace, name, err)
	}
	for _, ip := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
		if net.ParseIP(ip) != nil && !slices.Contains(hosts, ip) {
			hosts = append(hosts, ip)
		}
	}
	return hosts, nil
}

// ActiveCDI is the CDI resource whose spec counts: the oldest one that is
// not being deleted and not in phase Error (later ones are unwanted, as
// CDI's operator has it); nil when there is none.
func ActiveCDI(items []cdiv1.CDI) *cdiv1.CDI {
	var best *cdiv1.CDI
	for i := range items {
		c := &items[i]
		if c.DeletionTimestamp != nil || c.Status.Phase == "Error" {
			continue
		}
		if best == nil || c.CreationTimestamp.Before(&best.CreationTimestamp) ||
			(c.CreationTimestamp.Equal(&best.CreationTimestamp) && c.Name < best.Name) {
			best = c
		}
	}
	return best
}

// Reconciler runs the Rotator at start, whenever a CDI resource changes,
// when a certificate is next due, and every Poll at the latest.
type Reconciler struct {
	Rotator *Rotator
	// Client lists the CDI resources (cached).
	Client   client.Client
	Recorder events.EventRecorder
	// Poll bounds the wait between passes; zero is DefaultPoll.
	Poll time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

var request = reconcile.Request{NamespacedName: types.NamespacedName{Name: "certificates"}}

// SetupWithManager registers the reconciler on mgr (leader only).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{request}
	})
	err := ctrl.NewControllerManagedBy(mgr).
		Named("certificates").
		Watches(&cdiv1.CDI{}, one, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			q.Add(request)
			return nil
		})).
		Complete(r)
	if err != nil {
		return fmt.Errorf("building the certificate controller: %w", err)
	}
	return nil
}

// Reconcile does one pass and schedules the next.
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	poll := r.Poll
	if poll <= 0 {
		poll = DefaultPoll
	}
	var cdis cdiv1.CDIList
	if err := r.Client.List(ctx, &cdis); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing CDI resources: %w", err)
	}
	var cc *cdiv1.CDICertConfig
	cr := ActiveCDI(cdis.Items)
	if cr != nil {
		cc = cr.Spec.CertConfig
	}
	settings, problems := SettingsFrom(cc)
	for _, p := range problems {
		log.FromContext(ctx).Info("ignoring part of the CDI resource's certConfig", "cdi", cr.Name, "problem", p)
		if r.Recorder != nil {
			r.Recorder.Eventf(cr, nil, corev1.EventTypeWarning, "InvalidCertConfig", "RotateCertificates", "%s", p)
		}
	}
	t := now()
	next, err := r.Rotator.Sync(ctx, settings, t)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("keeping the certificates in %s: %w", r.Rotator.Namespace, err)
	}
	wait := poll
	if !next.IsZero() {
		// A moment past the due time, so the pass after it sees it due.
		if d := next.Sub(t) + 100*time.Millisecond; d < wait {
			wait = max(d, 100*time.Millisecond)
		}
	}
	return reconcile.Result{RequeueAfter: wait}, nil
}
