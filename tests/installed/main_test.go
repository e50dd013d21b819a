// Package installed installs Kubefill from manifests/ onto a local cluster
// with a real node (tests/cluster), as `kubectl apply -k manifests` would,
// with the image built here, and runs a smoke set against the installed
// components: the controller, the API server and the upload proxy as
// Deployments, reached through their Services, the APIService and the
// webhook configurations, with the certificates the controller makes.
// Nothing of Kubefill runs in the test process.
package installed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/cluster"
)

const (
	// installNS is the manifests' namespace.
	installNS = "kubefill-system"
	// manifestImage is the image the manifests name; image is the one the
	// node has (hack/images.sh), put in its place as a kustomize image
	// override would (and in --worker-image, which must stay equal to it).
	manifestImage = "kubefill/kubefill:latest"
	image         = "kubefill/kubefill:e2e"
	fieldManager  = "kubefill-installed-test"
)

var (
	cl  *cluster.Cluster
	kc  client.Client
	dyn dynamic.Interface
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Println("installed: skipped: the local cluster needs root (mounts, network namespaces)")
		return 0
	}
	if err := cluster.SweepStale(); err != nil {
		log.Printf("installed: sweeping stale clusters: %v", err)
	}
	start := time.Now()
	c, err := cluster.Start(context.Background(), cluster.Options{Storage: true, Node: true, Logf: log.Printf,
		KeepDir: os.Getenv("KUBEFILL_KEEP_CLUSTER_DIR") != ""})
	if err != nil {
		fmt.Fprintf(os.Stderr, "installed: start local cluster: %v\n", err)
		return 1
	}
	cl = c
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		log.Printf("installed: %v: tearing the cluster down", s)
		_ = c.Stop()
		os.Exit(2)
	}()
	code := func() int {
		fmt.Printf("installed: cluster up in %s\n", time.Since(start).Round(time.Millisecond))
		if kc, err = client.New(c.Config, client.Options{Scheme: controller.NewScheme()}); err == nil {
			dyn, err = dynamic.NewForConfig(c.Config)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "installed:", err)
			return 1
		}
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		if err := install(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "installed: install: %v\n%s", err, diagnose(context.Background()))
			return 1
		}
		fmt.Printf("installed: kubectl apply -k manifests equivalent done, every Deployment available, in %s\n", time.Since(t0).Round(time.Millisecond))
		code := m.Run()
		if code != 0 {
			fmt.Fprint(os.Stderr, diagnose(context.Background()))
		}
		return code
	}()
	signal.Stop(sigs)
	state := c.State()
	if err := c.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "installed: stop local cluster: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	if left := state.Leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "installed: left behind after Stop: %v\n", left)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// repoRoot is the top of the checkout.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// kustomizeResources lists the files a kustomization names, recursively,
// in its order (what `kubectl apply -k` reads; the manifests use nothing
// but resources).
func kustomizeResources(dir string) ([]string, error) {
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
			sub, err := kustomizeResources(p)
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

// manifestObjects reads every object of the install, with the image
// override applied.
func manifestObjects() ([]*unstructured.Unstructured, error) {
	files, err := kustomizeResources(filepath.Join(repoRoot(), "manifests"))
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		raw = bytes.ReplaceAll(raw, []byte(manifestImage), []byte(image))
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
	// kustomize's order: namespaces and CRDs first.
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

// install applies the manifests server-side, in order, and waits for the
// Deployments and the APIService.
func install(ctx context.Context) error {
	objs, err := manifestObjects()
	if err != nil {
		return err
	}
	disc := memory.NewMemCacheClient(cl.Client.Discovery())
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(disc)
	crdsEstablished := false
	for _, u := range objs {
		if u.GetKind() != "Namespace" && u.GetKind() != "CustomResourceDefinition" && !crdsEstablished {
			if err := waitCRDs(ctx, objs); err != nil {
				return err
			}
			disc.Invalidate()
			mapper.Reset()
			crdsEstablished = true
		}
		if err := apply(ctx, mapper, u); err != nil {
			return err
		}
	}
	for _, d := range []string{"kubefill-controller", "kubefill-apiserver", "kubefill-uploadproxy"} {
		if err := waitDeployment(ctx, d); err != nil {
			return err
		}
	}
	return waitAPIService(ctx, "v1beta1.upload.cdi.kubevirt.io")
}

func apply(ctx context.Context, mapper meta.RESTMapper, u *unstructured.Unstructured) error {
	gvk := u.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) && gvk.Group == "monitoring.coreos.com" {
		// The alerts need the Prometheus operator, which this cluster lacks.
		log.Printf("installed: skipping %s %s: no Prometheus operator here", gvk.Kind, u.GetName())
		return nil
	}
	if err != nil {
		return fmt.Errorf("mapping %s: %w", gvk, err)
	}
	raw, err := u.MarshalJSON()
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	if _, err := ri.Patch(ctx, u.GetName(), types.ApplyPatchType, raw, metav1.PatchOptions{FieldManager: fieldManager, Force: ptrTrue()}); err != nil {
		return fmt.Errorf("applying %s %s/%s: %w", gvk.Kind, u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

func ptrTrue() *bool { b := true; return &b }

func poll(ctx context.Context, what string, cond func() (bool, string, error)) error {
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

func waitCRDs(ctx context.Context, objs []*unstructured.Unstructured) error {
	gvr := schemaGVR("apiextensions.k8s.io", "v1", "customresourcedefinitions")
	for _, u := range objs {
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		err := poll(ctx, "CRD "+u.GetName()+" to be established", func() (bool, string, error) {
			got, err := dyn.Resource(gvr).Get(ctx, u.GetName(), metav1.GetOptions{})
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

func waitDeployment(ctx context.Context, name string) error {
	return poll(ctx, "Deployment "+installNS+"/"+name+" to be available", func() (bool, string, error) {
		d := &appsv1.Deployment{}
		if err := kc.Get(ctx, types.NamespacedName{Namespace: installNS, Name: name}, d); err != nil {
			return false, "", err
		}
		return d.Status.AvailableReplicas >= 1 && d.Status.UpdatedReplicas >= 1 && d.Status.ObservedGeneration >= d.Generation,
			fmt.Sprintf("%d available, %d updated", d.Status.AvailableReplicas, d.Status.UpdatedReplicas), nil
	})
}

func waitAPIService(ctx context.Context, name string) error {
	gvr := schemaGVR("apiregistration.k8s.io", "v1", "apiservices")
	return poll(ctx, "APIService "+name+" to be available", func() (bool, string, error) {
		got, err := dyn.Resource(gvr).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		ok, msg := cluster.APIServiceAvailable(got)
		return ok, msg, nil
	})
}

// diagnose describes the install's pods, with the last log lines of each.
func diagnose(ctx context.Context) string {
	if cl == nil || kc == nil {
		return ""
	}
	var b strings.Builder
	pods := &corev1.PodList{}
	if err := kc.List(ctx, pods, client.InNamespace(installNS)); err != nil {
		return err.Error()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s: %s", p.Name, p.Status.Phase)
		for _, s := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, " %s ready=%v restarts=%d", s.Name, s.Ready, s.RestartCount)
			if w := s.State.Waiting; w != nil {
				fmt.Fprintf(&b, " waiting %s: %s", w.Reason, w.Message)
			}
		}
		b.WriteString("\n")
		for _, ct := range p.Spec.Containers {
			logs, err := cl.PodLogs(ctx, installNS, p.Name, ct.Name)
			if err != nil {
				continue
			}
			lines := strings.Split(strings.TrimSpace(logs), "\n")
			if len(lines) > 15 {
				lines = lines[len(lines)-15:]
			}
			fmt.Fprintf(&b, "  logs of %s:\n    %s\n", ct.Name, strings.Join(lines, "\n    "))
		}
	}
	return b.String()
}

// getCDIAndDeployments prints what `kubectl get cdi,deploy -n <ns>` prints.
func getCDIAndDeployments(ctx context.Context, ns string) (string, error) {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 8, 3, ' ', 0)
	cdis := &cdiv1.CDIList{}
	if err := kc.List(ctx, cdis); err != nil {
		return "", err
	}
	fmt.Fprintln(w, "NAME\tAGE\tPHASE")
	for _, c := range cdis.Items {
		fmt.Fprintf(w, "cdi.cdi.kubevirt.io/%s\t%s\t%s\n", c.Name, age(c.CreationTimestamp), c.Status.Phase)
	}
	_ = w.Flush()
	b.WriteString("\n")
	w = tabwriter.NewWriter(&b, 0, 8, 3, ' ', 0)
	deps := &appsv1.DeploymentList{}
	if err := kc.List(ctx, deps, client.InNamespace(ns)); err != nil {
		return "", err
	}
	fmt.Fprintln(w, "NAME\tREADY\tUP-TO-DATE\tAVAILABLE\tAGE")
	for _, d := range deps.Items {
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		fmt.Fprintf(w, "deployment.apps/%s\t%d/%d\t%d\t%d\t%s\n", d.Name, d.Status.ReadyReplicas, want, d.Status.UpdatedReplicas, d.Status.AvailableReplicas, age(d.CreationTimestamp))
	}
	_ = w.Flush()
	return b.String(), nil
}

func age(t metav1.Time) string { return duration.HumanDuration(time.Since(t.Time)) }
