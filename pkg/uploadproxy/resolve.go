package uploadproxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/contract"
)

// Endpoint is where an upload server is reached.
type Endpoint struct {
	// URL is the base URL, e.g. https://10.0.0.7:8443.
	URL string
	// ServerName is the name its serving certificate must carry; empty means URL's host.
	ServerName string
}

// Resolver finds the upload server that takes an upload into the claim
// namespace/name; errors carry the status to answer with (see HTTPStatus).
type Resolver interface {
	Resolve(ctx context.Context, namespace, name string) (Endpoint, error)
}

// Locator turns the claim that an upload pod serves into that pod's endpoint.
type Locator interface {
	ResolveUploadServer(ctx context.Context, namespace, serving string) (Endpoint, error)
}

// PodIPLocator addresses the upload pod by its IP, for clusters without
// cluster DNS and Service routing (the local test cluster).
type PodIPLocator struct {
	Client kubernetes.Interface
	Port   int
}

// ResolveUploadServer reads pod cdi-upload-<serving> and returns
// https://<podIP>:<port>, to be verified as the Service's DNS name.
func (l PodIPLocator) ResolveUploadServer(ctx context.Context, namespace, serving string) (Endpoint, error) {
	name := cdiv1.UploadPodName(serving)
	pod, err := l.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Endpoint{}, statusErrorf(http.StatusServiceUnavailable, "upload pod %s/%s does not exist yet; retry", namespace, name)
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("reading upload pod %s/%s: %w", namespace, name, err)
	}
	if pod.Status.PodIP == "" {
		return Endpoint{}, statusErrorf(http.StatusServiceUnavailable, "upload pod %s/%s has no IP yet; retry", namespace, name)
	}
	port := l.Port
	if port == 0 {
		port = contract.UploadServerPort
	}
	return Endpoint{
		URL:        "https://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port)),
		ServerName: ServiceHost(namespace, serving),
	}, nil
}

// ServiceLocator addresses the upload Service by its cluster DNS name, as CDI does.
type ServiceLocator struct {
	Port int // contract.UploadServicePort (443) if zero
}

// ResolveUploadServer returns https://<service>.<namespace>.svc[:port], the
// upload Service of serving (ServiceHost).
func (l ServiceLocator) ResolveUploadServer(_ context.Context, namespace, serving string) (Endpoint, error) {
	host := ServiceHost(namespace, serving)
	if l.Port != 0 && l.Port != contract.UploadServicePort {
		host = net.JoinHostPort(host, strconv.Itoa(l.Port))
	}
	return Endpoint{URL: "https://" + host}, nil
}

// KubeResolver reads the claim (and its prime) from the API server, waits up
// to Wait for the upload pod to be ready, and asks Locator for its address.
type KubeResolver struct {
	Client  kubernetes.Interface
	Locator Locator
	// Wait bounds how long a request waits for the upload pod; 0 means no waiting.
	Wait time.Duration
	// Poll is the interval between reads while waiting; 1 s if zero.
	Poll time.Duration
}

// Resolve implements Resolver.
func (r *KubeResolver) Resolve(ctx context.Context, namespace, name string) (Endpoint, error) {
	poll := r.Poll
	if poll <= 0 {
		poll = time.Second
	}
	deadline := time.Now().Add(r.Wait)
	for {
		d, err := r.decide(ctx, namespace, name)
		if err != nil {
			return Endpoint{}, err
		}
		switch d.State {
		case TargetReady:
			return r.Locator.ResolveUploadServer(ctx, namespace, d.Serving)
		case TargetCompleted:
			return Endpoint{}, statusErrorf(http.StatusConflict, "%s", d.Reason)
		case TargetInvalid:
			return Endpoint{}, statusErrorf(http.StatusBadRequest, "%s", d.Reason)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return Endpoint{}, statusErrorf(http.StatusServiceUnavailable, "%s after waiting %s; retry later", d.Reason, r.Wait)
		}
		select {
		case <-ctx.Done():
			return Endpoint{}, fmt.Errorf("waiting for the upload pod of %s/%s: %w", namespace, name, ctx.Err())
		case <-time.After(min(poll, left)):
		}
	}
}

func (r *KubeResolver) decide(ctx context.Context, namespace, name string) (Decision, error) {
	pvcs := r.Client.CoreV1().PersistentVolumeClaims(namespace)
	pvc, err := pvcs.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Decision{}, statusErrorf(http.StatusNotFound, "PersistentVolumeClaim %s/%s not found", namespace, name)
	}
	if err != nil {
		return Decision{}, fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", namespace, name, err)
	}
	var prime *corev1.PersistentVolumeClaim
	if primeName := pvc.Annotations[cdiv1.AnnPVCPrimeName]; primeName != "" {
		prime, err = pvcs.Get(ctx, primeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			prime, err = nil, nil
		}
		if err != nil {
			return Decision{}, fmt.Errorf("reading PVC-prime %s/%s: %w", namespace, primeName, err)
		}
	}
	return DecideTarget(pvc, prime), nil
}
