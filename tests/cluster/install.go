package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// ManifestImage is the image manifests/ names; an install puts the image
// the node has in its place, as a kustomize image override would (in the
// Deployments and in the controller's --worker-image alike).
const ManifestImage = "kubefill/kubefill:latest"

// InstallDeployments are the Deployments of manifests/install.
var InstallDeployments = []string{"kubefill-controller", "kubefill-apiserver", "kubefill-uploadproxy"}

// UploadAPIService is the APIService of Kubefill's token API.
const UploadAPIService = "v1beta1.upload.cdi.kubevirt.io"

// InstallOptions say how to install Kubefill from the manifests.
type InstallOptions struct {
	// Image replaces ManifestImage (e.g. kubefill/kubefill:dev).
	Image string
	// FieldManager is the server-side apply manager.
	FieldManager string
	// Dirs are the kustomizations to apply, relative to the checkout, in
	// order (default: manifests). Objects of the Prometheus operator
	// (monitoring.coreos.com) are skipped where its CRDs are absent.
	Dirs []string
	// Logf reports what is skipped.
	Logf func(format string, args ...any)
	// APIServerArgs are added to the kubefill-apiserver container's
	// arguments, as an admin's kustomize patch would. NewInstaller makes
	// them --webhook-client-names=WebhookClientName when nil: this
	// cluster's kube-apiserver presents that certificate to the webhooks
	// (writeAdmissionConfig), so the install requires it, as docs/install.md
	// tells an admin to. An empty, non-nil slice adds nothing.
	APIServerArgs []string
}

// APIServerDeployment is the Deployment of `kubefill apiserver`.
const APIServerDeployment = "kubefill-apiserver"

// KustomizeResources lists the files a kustomization names, recursively,
// in its order (what `kubectl apply -k` reads; the manifests use nothing
// but resources).
func KustomizeResources(dir string) ([]string, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(raw, &k); err != nil {
		return nil, fmt.Errorf("%s/kustomization.yaml: %w", dir, err)
	}
	var files []string
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			sub, err := KustomizeResources(p)
			if err != nil {
				return nil, err
			}
			files = append(files, sub...)
			continue
		}
		files = append(files, p)
	}
	return files, nil
}

// ManifestObjects reads every object of a kustomization, with the image
// override applied, namespaces and CRDs first (kustomize's order).
func ManifestObjects(dir, image string) ([]*unstructured.Unstructured, error) {
	files, err := KustomizeResources(dir)
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if image != "" {
			raw = bytes.ReplaceAll(raw, []byte(ManifestImage), []byte(image))
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if len(u.Object) > 0 {
				objs = append(objs, u)
			}
		}
	}
	rank := func(u *unstructured.Unstructured) int {
		switch u.GetKind() {
		case "Namespace":
			return 0
		case "CustomResourceDefinition":
			return 1
		}
		return 2
	}
	sort.SliceStable(objs, func(i, j int) bool { return rank(objs[i]) < rank(objs[j]) })
	return objs, nil
}

// Installer applies manifests server-side, as `kubectl apply -k` does.
type Installer struct {
	dyn    dynamic.Interface
	disc   discovery.CachedDiscoveryInterface
	mapper *restmapper.DeferredDiscoveryRESTMapper
	opts   InstallOptions
}

// NewInstaller makes an Installer for the cluster.
func (c *Cluster) NewInstaller(opts InstallOptions) (*Installer, error) {
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	if opts.FieldManager == "" {
		opts.FieldManager = "kubefill-install"
	}
	if len(opts.Dirs) == 0 {
		opts.Dirs = []string{"manifests"}
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.APIServerArgs == nil {
		opts.APIServerArgs = []string{"--webhook-client-names=" + WebhookClientName}
	}
	for i, d := range opts.Dirs {
		if !filepath.IsAbs(d) {
			opts.Dirs[i] = filepath.Join(c.repo, d)
		}
	}
	disc := memory.NewMemCacheClient(c.Client.Discovery())
	return &Installer{dyn: dyn, disc: disc, mapper: restmapper.NewDeferredDiscoveryRESTMapper(disc), opts: opts}, nil
}

// Install applies every kustomization of the options, in order, waiting
// for the CRDs to be established before the objects that need them, then
// waits for the Deployments and the APIService of the install.
func (in *Installer) Install(ctx context.Context) error {
	for _, dir := range in.opts.Dirs {
		objs, err := ManifestObjects(dir, in.opts.Image)
		if err != nil {
			return err
		}
		crdsEstablished := false
		for _, u := range objs {
			if u.GetKind() != "Namespace" && u.GetKind() != "CustomResourceDefinition" && !crdsEstablished {
				if err := in.waitCRDs(ctx, objs); err != nil {
					return err
				}
				in.disc.Invalidate()
				in.mapper.Reset()
				crdsEstablished = true
			}
			if err := addContainerArgs(u, APIServerDeployment, "apiserver", in.opts.APIServerArgs); err != nil {
				return err
			}
			if err := in.Apply(ctx, u); err != nil {
				return err
			}
		}
	}
	for _, d := range InstallDeployments {
		if err := in.WaitDeployment(ctx, KubefillNamespace, d); err != nil {
			return err
		}
	}
	return in.WaitAPIService(ctx, UploadAPIService)
}

// Uninstall deletes what Install applied except the CRDs (so the objects
// of Kubefill's kinds stay, as after `kubectl delete -k manifests/install`)
// and waits until the install's namespaces are gone. The APIService and the
// webhook configurations go first, so that kube-apiserver never calls a
// Service that is going; the namespaces last.
func (in *Installer) Uninstall(ctx context.Context) error {
	var objs []*unstructured.Unstructured
	for _, dir := range in.opts.Dirs {
		o, err := ManifestObjects(dir, in.opts.Image)
		if err != nil {
			return err
		}
		objs = append(objs, o...)
	}
	in.disc.Invalidate()
	in.mapper.Reset()
	var namespaces []string
	for _, u := range uninstallOrder(objs) {
		if u.GetKind() == "Namespace" {
			namespaces = append(namespaces, u.GetName())
		}
		if err := in.delete(ctx, u); err != nil {
			return err
		}
	}
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	for _, ns := range namespaces {
		err := pollUntil(ctx, "namespace "+ns+" to be gone", func() (bool, string, error) {
			got, err := in.dyn.Resource(gvr).Get(ctx, ns, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, "", nil
			}
			if err != nil {
				return false, "", err
			}
			phase, _, _ := unstructured.NestedString(got.Object, "status", "phase")
			return false, phase, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// uninstallOrder is what Uninstall deletes of the install's objects, in
// order: not the CRDs; what kube-apiserver calls (the APIService, the
// webhooks) first, the namespaces last, the rest in the reverse of the
// install's order.
func uninstallOrder(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	out := slices.DeleteFunc(slices.Clone(objs), func(u *unstructured.Unstructured) bool { return u.GetKind() == "CustomResourceDefinition" })
	slices.Reverse(out)
	slices.SortStableFunc(out, func(a, b *unstructured.Unstructured) int { return uninstallRank(a) - uninstallRank(b) })
	return out
}

// uninstallRank orders Uninstall's deletions (see uninstallOrder).
func uninstallRank(u *unstructured.Unstructured) int {
	switch u.GetKind() {
	case "APIService", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration":
		return 0
	case "Namespace":
		return 2
	}
	return 1
}

// delete deletes one object, in the background; one that is gone, or of a
// kind the cluster does not serve (the Prometheus operator's), is no error.
func (in *Installer) delete(ctx context.Context, u *unstructured.Unstructured) error {
	gvk := u.GroupVersionKind()
	m, err := in.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mapping %s: %w", gvk, err)
	}
	var ri dynamic.ResourceInterface = in.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = in.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	policy := metav1.DeletePropagationBackground
	if err := ri.Delete(ctx, u.GetName(), metav1.DeleteOptions{PropagationPolicy: &policy}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s %s/%s: %w", gvk.Kind, u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// addContainerArgs appends args to container's arguments when u is
// Deployment deployment of the install namespace.
func addContainerArgs(u *unstructured.Unstructured, deployment, container string, args []string) error {
	if len(args) == 0 || u.GetKind() != "Deployment" || u.GetName() != deployment || u.GetNamespace() != KubefillNamespace {
		return nil
	}
	containers, _, err := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
	if err != nil {
		return fmt.Errorf("Deployment %s: %w", deployment, err)
	}
	found := false
	for i, c := range containers {
		m, ok := c.(map[string]any)
		if !ok || m["name"] != container {
			continue
		}
		have, _, _ := unstructured.NestedStringSlice(m, "args")
		have = append(have, args...)
		all := make([]any, len(have))
		for j, a := range have {
			all[j] = a
		}
		m["args"] = all
		containers[i] = m
		found = true
	}
	if !found {
		return fmt.Errorf("Deployment %s has no container %s to give %v", deployment, container, args)
	}
	return unstructured.SetNestedSlice(u.Object, containers, "spec", "template", "spec", "containers")
}

// Apply applies one object server-side (forcing conflicts, as a
// re-install does). An object of the Prometheus operator is skipped,
// with a note, where its CRDs are absent.
func (in *Installer) Apply(ctx context.Context, u *unstructured.Unstructured) error {
	gvk := u.GroupVersionKind()
	m, err := in.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) && gvk.Group == "monitoring.coreos.com" {
		in.opts.Logf("install: skipping %s %s: no Prometheus operator here", gvk.Kind, u.GetName())
		return nil
	}
	if err != nil {
		return fmt.Errorf("mapping %s: %w", gvk, err)
	}
	raw, err := u.MarshalJSON()
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = in.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = in.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	force := true
	if _, err := ri.Patch(ctx, u.GetName(), types.ApplyPatchType, raw, metav1.PatchOptions{FieldManager: in.opts.FieldManager, Force: &force}); err != nil {
		return fmt.Errorf("applying %s %s/%s: %w", gvk.Kind, u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

func pollUntil(ctx context.Context, what string, cond func() (bool, string, error)) error {
	last := ""
	for {
		ok, status, err := cond()
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		last = status
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s (last: %s)", what, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (in *Installer) waitCRDs(ctx context.Context, objs []*unstructured.Unstructured) error {
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, u := range objs {
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		err := pollUntil(ctx, "CRD "+u.GetName()+" to be established", func() (bool, string, error) {
			got, err := in.dyn.Resource(gvr).Get(ctx, u.GetName(), metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				if m, _ := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
					return true, "", nil
				}
			}
			return false, "not established", nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

var deploymentsGVR = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}

// WaitDeployment waits until Deployment ns/name has an available, updated
// replica of its latest generation.
func (in *Installer) WaitDeployment(ctx context.Context, ns, name string) error {
	return pollUntil(ctx, "Deployment "+ns+"/"+name+" to be available", func() (bool, string, error) {
		d, err := in.dyn.Resource(deploymentsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		avail, _, _ := unstructured.NestedInt64(d.Object, "status", "availableReplicas")
		updated, _, _ := unstructured.NestedInt64(d.Object, "status", "updatedReplicas")
		observed, _, _ := unstructured.NestedInt64(d.Object, "status", "observedGeneration")
		return avail >= 1 && updated >= 1 && observed >= d.GetGeneration(),
			fmt.Sprintf("%d available, %d updated", avail, updated), nil
	})
}

// WaitAPIService waits until the APIService name is Available.
func (in *Installer) WaitAPIService(ctx context.Context, name string) error {
	gvr := schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}
	return pollUntil(ctx, "APIService "+name+" to be available", func() (bool, string, error) {
		got, err := in.dyn.Resource(gvr).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		ok, msg := APIServiceAvailable(got)
		return ok, msg, nil
	})
}

// GetCDIAndDeployments prints what `kubectl get cdi,deploy -n ns` prints.
func GetCDIAndDeployments(ctx context.Context, dyn dynamic.Interface, ns string) (string, error) {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 8, 3, ' ', 0)
	cdis, err := dyn.Resource(schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "cdis"}).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	age := func(t metav1.Time) string { return duration.HumanDuration(time.Since(t.Time)) }
	fmt.Fprintln(w, "NAME\tAGE\tPHASE")
	for _, c := range cdis.Items {
		phase, _, _ := unstructured.NestedString(c.Object, "status", "phase")
		fmt.Fprintf(w, "cdi.cdi.kubevirt.io/%s\t%s\t%s\n", c.GetName(), age(c.GetCreationTimestamp()), phase)
	}
	_ = w.Flush()
	b.WriteString("\n")
	w = tabwriter.NewWriter(&b, 0, 8, 3, ' ', 0)
	deps, err := dyn.Resource(deploymentsGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	fmt.Fprintln(w, "NAME\tREADY\tUP-TO-DATE\tAVAILABLE\tAGE")
	for _, d := range deps.Items {
		want, found, _ := unstructured.NestedInt64(d.Object, "spec", "replicas")
		if !found {
			want = 1
		}
		ready, _, _ := unstructured.NestedInt64(d.Object, "status", "readyReplicas")
		updated, _, _ := unstructured.NestedInt64(d.Object, "status", "updatedReplicas")
		avail, _, _ := unstructured.NestedInt64(d.Object, "status", "availableReplicas")
		fmt.Fprintf(w, "deployment.apps/%s\t%d/%d\t%d\t%d\t%s\n", d.GetName(), ready, want, updated, avail, age(d.GetCreationTimestamp()))
	}
	_ = w.Flush()
	return b.String(), nil
}
