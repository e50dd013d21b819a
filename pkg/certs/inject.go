package certs

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// apiServiceListGVK is apiregistration.k8s.io/v1 APIServiceList, read as
// unstructured (kube-aggregator's types are not a dependency).
var apiServiceListGVK = schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIServiceList"}

// InjectCABundle sets bundle as the caBundle of every APIService, and of
// every webhook of every validating and mutating webhook configuration,
// that points at Service namespace/service. It returns how many objects it
// changed.
func InjectCABundle(ctx context.Context, c client.Client, r client.Reader, namespace, service string, bundle []byte) (int, error) {
	changed := 0
	points := func(ref *admissionregistrationv1.ServiceReference) bool {
		return ref != nil && ref.Namespace == namespace && ref.Name == service
	}

	apis := &unstructured.UnstructuredList{}
	apis.SetGroupVersionKind(apiServiceListGVK)
	if err := r.List(ctx, apis); err != nil {
		return changed, fmt.Errorf("listing APIServices: %w", err)
	}
	want := base64.StdEncoding.EncodeToString(bundle)
	for i := range apis.Items {
		a := &apis.Items[i]
		ns, _, _ := unstructured.NestedString(a.Object, "spec", "service", "namespace")
		name, _, _ := unstructured.NestedString(a.Object, "spec", "service", "name")
		if ns != namespace || name != service {
			continue
		}
		if got, _, _ := unstructured.NestedString(a.Object, "spec", "caBundle"); got == want {
			continue
		}
		if err := unstructured.SetNestedField(a.Object, want, "spec", "caBundle"); err != nil {
			return changed, err
		}
		// The aggregator refuses insecureSkipTLSVerify together with a caBundle.
		unstructured.RemoveNestedField(a.Object, "spec", "insecureSkipTLSVerify")
		if err := c.Update(ctx, a); err != nil {
			return changed, fmt.Errorf("updating APIService %s: %w", a.GetName(), err)
		}
		changed++
	}

	validating := &admissionregistrationv1.ValidatingWebhookConfigurationList{}
	if err := r.List(ctx, validating); err != nil {
		return changed, fmt.Errorf("listing ValidatingWebhookConfigurations: %w", err)
	}
	for i := range validating.Items {
		w := &validating.Items[i]
		configs := make([]*admissionregistrationv1.WebhookClientConfig, len(w.Webhooks))
		for j := range w.Webhooks {
			configs[j] = &w.Webhooks[j].ClientConfig
		}
		if setBundle(configs, points, bundle) {
			if err := c.Update(ctx, w); err != nil {
				return changed, fmt.Errorf("updating ValidatingWebhookConfiguration %s: %w", w.Name, err)
			}
			changed++
		}
	}

	mutating := &admissionregistrationv1.MutatingWebhookConfigurationList{}
	if err := r.List(ctx, mutating); err != nil {
		return changed, fmt.Errorf("listing MutatingWebhookConfigurations: %w", err)
	}
	for i := range mutating.Items {
		w := &mutating.Items[i]
		configs := make([]*admissionregistrationv1.WebhookClientConfig, len(w.Webhooks))
		for j := range w.Webhooks {
			configs[j] = &w.Webhooks[j].ClientConfig
		}
		if setBundle(configs, points, bundle) {
			if err := c.Update(ctx, w); err != nil {
				return changed, fmt.Errorf("updating MutatingWebhookConfiguration %s: %w", w.Name, err)
			}
			changed++
		}
	}
	return changed, nil
}

// setBundle sets bundle on the webhook client configs that point at the
// Service, and says whether any changed. Validating and mutating
// configurations share it.
func setBundle(configs []*admissionregistrationv1.WebhookClientConfig, points func(*admissionregistrationv1.ServiceReference) bool, bundle []byte) bool {
	dirty := false
	for _, cc := range configs {
		if points(cc.Service) && !bytes.Equal(cc.CABundle, bundle) {
			cc.CABundle, dirty = bundle, true
		}
	}
	return dirty
}
