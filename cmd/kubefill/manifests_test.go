package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/kubefill/kubefill/pkg/apiserver/admission"
	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/pkg/uploadproxy"
)

const installDir = "../../manifests/install"

// installNamespace is the namespace of every namespaced object of the install.
const installNamespace = "kubefill-system"

// manifestDoc is one YAML document of manifests/install.
type manifestDoc struct {
	file string
	kind string
	raw  []byte
}

// readInstallManifests splits every manifests/install/*.yaml into documents.
func readInstallManifests(t *testing.T) []manifestDoc {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(installDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", installDir, err)
	}
	var docs []manifestDoc
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			raw, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var meta struct{ Kind string }
			if err := yaml.Unmarshal(raw, &meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if meta.Kind == "" {
				continue // comments only
			}
			docs = append(docs, manifestDoc{file: filepath.Base(f), kind: meta.Kind, raw: raw})
		}
	}
	return docs
}

// decodeAll strictly decodes the documents of kind into T: a misspelt field
// fails here rather than being dropped by kubectl.
func decodeAll[T any](t *testing.T, docs []manifestDoc, kind string) []T {
	t.Helper()
	var out []T
	for _, d := range docs {
		if d.kind != kind {
			continue
		}
		var v T
		if err := yaml.UnmarshalStrict(d.raw, &v); err != nil {
			t.Fatalf("%s: %s: %v", d.file, kind, err)
		}
		out = append(out, v)
	}
	return out
}

// subcommand finds the root command's child a container's command names.
func subcommand(t *testing.T, c corev1.Container) (*cobra.Command, []string) {
	t.Helper()
	if len(c.Command) < 2 || c.Command[0] != "kubefill" {
		t.Fatalf("container %s: command %v, want [kubefill <subcommand>]", c.Name, c.Command)
	}
	for _, sub := range newRootCommand().Commands() {
		if sub.Name() == c.Command[1] {
			return sub, append(slices.Clone(c.Command[2:]), c.Args...)
		}
	}
	t.Fatalf("container %s: no subcommand %q", c.Name, c.Command[1])
	return nil, nil
}

func flagString(t *testing.T, cmd *cobra.Command, name string) string {
	t.Helper()
	f := cmd.Flags().Lookup(name)
	if f == nil {
		t.Fatalf("%s has no flag --%s", cmd.Name(), name)
	}
	return f.Value.String()
}

func flagInt(t *testing.T, cmd *cobra.Command, name string) int {
	t.Helper()
	v, err := cmd.Flags().GetInt(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func flagDuration(t *testing.T, cmd *cobra.Command, name string) time.Duration {
	t.Helper()
	v, err := cmd.Flags().GetDuration(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// podNamespaceFromDownwardAPI: the install namespace must come from the pod.
func podNamespaceFromDownwardAPI(c corev1.Container) bool {
	for _, e := range c.Env {
		if e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace" {
			return true
		}
	}
	return false
}

// fileFlags are the flags of each subcommand that name a file or directory
// the pod must have.
var fileFlags = map[string][]string{
	"apiserver":   {"tls-cert-file", "tls-private-key-file", "generated-ca-file"},
	"uploadproxy": {"tls-cert-file", "tls-private-key-file", "signing-key-dir", "client-cert-file", "client-key-file", "upload-server-ca-file"},
	"controller":  nil,
}

// TestDeploymentArgsParse builds the real commands and parses every
// Deployment's arguments with them, then checks what each command checks
// before it starts (uploadproxy.RunOptions.Validate, apiserver's flag checks).
func TestDeploymentArgsParse(t *testing.T) {
	docs := readInstallManifests(t)
	deployments := decodeAll[appsv1.Deployment](t, docs, "Deployment")
	seen := map[string]bool{}
	for _, d := range deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			t.Run(d.Name+"/"+c.Name, func(t *testing.T) {
				cmd, args := subcommand(t, c)
				seen[cmd.Name()] = true
				if err := cmd.ParseFlags(args); err != nil {
					t.Fatalf("kubefill %s %v: %v", cmd.Name(), args, err)
				}
				if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
					t.Fatalf("kubefill %s: positional arguments %v: %v", cmd.Name(), cmd.Flags().Args(), err)
				}
				if c.Image != "kubefill/kubefill:latest" {
					t.Errorf("image %s, want kubefill/kubefill:latest", c.Image)
				}
				if !podNamespaceFromDownwardAPI(c) {
					t.Errorf("no POD_NAMESPACE from the downward API (metadata.namespace)")
				}
				switch cmd.Name() {
				case "controller":
					if w := flagString(t, cmd, "worker-image"); w != c.Image {
						t.Errorf("--worker-image %s differs from the controller's image %s: worker pods would run another version", w, c.Image)
					}
				case "apiserver":
					cert, key := flagString(t, cmd, "tls-cert-file"), flagString(t, cmd, "tls-private-key-file")
					if (cert == "") != (key == "") {
						t.Errorf("--tls-cert-file and --tls-private-key-file go together")
					}
					if cert == "" {
						t.Errorf("no --tls-cert-file: a generated certificate changes at every start and breaks the caBundle")
					}
					if p := flagInt(t, cmd, "secure-port"); p <= 0 || p > 65535 {
						t.Errorf("--secure-port %d", p)
					}
					if flagDuration(t, cmd, "token-lifetime") <= 0 || flagDuration(t, cmd, "clone-token-lifetime") <= 0 {
						t.Errorf("token lifetimes must be positive")
					}
					if s := flagString(t, cmd, "signing-key-secret"); s != token.DefaultSigningKeySecretName {
						t.Errorf("--signing-key-secret %s: the proxy mounts and the Role names %s", s, token.DefaultSigningKeySecretName)
					}
				case "uploadproxy":
					opts := uploadproxy.RunOptions{
						BindAddress:   flagString(t, cmd, "bind-address"),
						SecurePort:    flagInt(t, cmd, "secure-port"),
						CertFile:      flagString(t, cmd, "tls-cert-file"),
						KeyFile:       flagString(t, cmd, "tls-private-key-file"),
						SigningKeyDir: flagString(t, cmd, "signing-key-dir"),
						TokenLeeway:   flagDuration(t, cmd, "token-leeway"),
						Upstream: uploadproxy.UpstreamTLS{
							ClientCertFile: flagString(t, cmd, "client-cert-file"),
							ClientKeyFile:  flagString(t, cmd, "client-key-file"),
							CAFile:         flagString(t, cmd, "upload-server-ca-file"),
							ServerName:     flagString(t, cmd, "upload-server-name"),
						},
						Address:      flagString(t, cmd, "upload-server-address"),
						UpstreamPort: flagInt(t, cmd, "upload-server-port"),
						PodWait:      flagDuration(t, cmd, "pod-ready-timeout"),
					}
					if err := opts.Validate(); err != nil {
						t.Errorf("uploadproxy options: %v", err)
					}
				default:
					t.Errorf("unexpected subcommand %s in a Deployment", cmd.Name())
				}
				checkFilesMounted(t, d, c, cmd)
			})
		}
	}
	for _, want := range []string{"controller", "apiserver", "uploadproxy"} {
		if !seen[want] {
			t.Errorf("no Deployment runs kubefill %s", want)
		}
	}
}

// checkFilesMounted: every file a flag names lies under a volume mount, and
// is a key the mounted Secret will hold.
func checkFilesMounted(t *testing.T, d appsv1.Deployment, c corev1.Container, cmd *cobra.Command) {
	t.Helper()
	volumes := map[string]corev1.Volume{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	keys := secretKeys(t)
	for _, name := range fileFlags[cmd.Name()] {
		file := flagString(t, cmd, name)
		if file == "" {
			continue
		}
		var mount *corev1.VolumeMount
		for i, m := range c.VolumeMounts {
			if file == m.MountPath || strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil {
			t.Errorf("--%s=%s is under no volume mount of %s", name, file, c.Name)
			continue
		}
		v, ok := volumes[mount.Name]
		if !ok || v.Secret == nil {
			t.Errorf("--%s=%s: mount %s is not a Secret volume", name, file, mount.Name)
			continue
		}
		if file == mount.MountPath {
			continue // a directory: its files are checked through the items below
		}
		rel := strings.TrimPrefix(file, strings.TrimSuffix(mount.MountPath, "/")+"/")
		key := rel
		if len(v.Secret.Items) > 0 {
			key = ""
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					key = it.Key
				}
			}
			if key == "" {
				t.Errorf("--%s=%s: Secret volume %s projects no %s", name, file, mount.Name, rel)
				continue
			}
		}
		if !keys[v.Secret.SecretName][key] {
			t.Errorf("--%s=%s: Secret %s never holds key %s (it holds %v)", name, file, v.Secret.SecretName, key, keys[v.Secret.SecretName])
		}
	}
}

// secretCreators names, for every Secret a Deployment may mount, what
// creates it. The keys of the ones Kubefill makes are read from the real
// code below, not written down here.
var secretCreators = map[string]string{
	token.DefaultSigningKeySecretName: "kubefill apiserver (token.EnsureSigningKeySecret, at start)",
	certs.UploadServerClientCert:      "kubefill controller (the certificate controller, pkg/certs, at start; populators.EnsureUploadPKI with the first upload)",
	certs.UploadServerSigner:          "kubefill controller (pkg/certs)",
	certs.UploadServerClientSigner:    "kubefill controller (pkg/certs)",
	certs.UploadProxySigner:           "kubefill controller (pkg/certs)",
	certs.UploadProxyServerCert:       "kubefill controller (pkg/certs)",
	certs.APIServerSigner:             "kubefill controller (pkg/certs, --apiserver-certificates)",
	certs.APIServerServerCert:         "kubefill controller (pkg/certs, --apiserver-certificates), or cert-manager from the Certificate in manifests/install/cert-manager.yaml",
}

// secretKeys runs the code that makes Kubefill's Secrets against a fake
// client and returns every key each Secret can hold (after a signing key
// rotation too), plus the keys cert-manager writes for Certificates in the
// manifests.
func secretKeys(t *testing.T) map[string]map[string]bool {
	t.Helper()
	secretKeysOnce.Do(func() { secretKeysMade = makeSecretKeys(t) })
	if secretKeysMade == nil {
		t.Fatal("making the Secrets failed in an earlier test")
	}
	return secretKeysMade
}

var (
	secretKeysOnce sync.Once
	secretKeysMade map[string]map[string]bool
)

func makeSecretKeys(t *testing.T) map[string]map[string]bool {
	t.Helper()
	ctx := logf.IntoContext(context.Background(), logr.Discard())
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := admissionregistrationv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).Build()
	const ns = installNamespace
	if _, _, err := populators.EnsureUploadPKI(ctx, c, c, ns); err != nil {
		t.Fatal(err)
	}
	// The certificate controller's pass makes every chain.
	rot := &certs.Rotator{Store: certs.Store{Client: c, Namespace: ns}, APIServer: true}
	if _, err := rot.Sync(ctx, certs.DefaultSettings(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := token.EnsureSigningKeySecret(ctx, c, ns, token.DefaultSigningKeySecretName); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	list := &corev1.SecretList{}
	if err := c.List(ctx, list); err != nil {
		t.Fatal(err)
	}
	for _, sec := range list.Items {
		out[sec.Name] = map[string]bool{}
		for k := range sec.Data {
			out[sec.Name][k] = true
		}
		if sec.Name == token.DefaultSigningKeySecretName {
			pk, err := token.GenerateKey()
			if err != nil {
				t.Fatal(err)
			}
			rotated, err := token.RotateSecret(&sec, pk, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			for k := range rotated.Data {
				out[sec.Name][k] = true
			}
		}
	}
	// cert-manager writes tls.crt, tls.key and ca.crt into a Certificate's Secret.
	for _, d := range readInstallManifests(t) {
		if d.kind != "Certificate" {
			continue
		}
		var cert struct {
			Spec struct{ SecretName string } `json:"spec"`
		}
		if err := yaml.Unmarshal(d.raw, &cert); err != nil {
			t.Fatal(err)
		}
		out[cert.Spec.SecretName] = map[string]bool{"tls.crt": true, "tls.key": true, "ca.crt": true}
	}
	return out
}

// TestMountedSecretsHaveACreator: no Deployment waits for a Secret nothing makes.
func TestMountedSecretsHaveACreator(t *testing.T) {
	docs := readInstallManifests(t)
	keys := secretKeys(t)
	for name := range secretCreators {
		if keys[name] == nil {
			t.Errorf("secretCreators says %s is created by %s, but running that code made no such Secret", name, secretCreators[name])
		}
	}
	for _, d := range decodeAll[appsv1.Deployment](t, docs, "Deployment") {
		for _, v := range d.Spec.Template.Spec.Volumes {
			switch {
			case v.Secret != nil:
				name := v.Secret.SecretName
				if _, ok := secretCreators[name]; !ok || keys[name] == nil {
					t.Errorf("Deployment %s mounts Secret %s, which no Kubefill component nor the manifests create", d.Name, name)
					continue
				}
				for _, it := range v.Secret.Items {
					if !keys[name][it.Key] {
						t.Errorf("Deployment %s projects key %s of Secret %s, which never holds it", d.Name, it.Key, name)
					}
				}
				t.Logf("Deployment %s mounts Secret %s, made by %s", d.Name, name, secretCreators[name])
			case v.ConfigMap != nil:
				t.Errorf("Deployment %s mounts ConfigMap %s, which nothing creates", d.Name, v.ConfigMap.Name)
			}
		}
	}
}

// apiService is the part of apiregistration.k8s.io/v1 APIService checked
// here (kube-aggregator is not a dependency of this module).
type apiService struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   map[string]any `json:"metadata"`
	Spec       apiServiceSpec `json:"spec"`
}

type apiServiceSpec struct {
	Group                 string `json:"group"`
	Version               string `json:"version"`
	GroupPriorityMinimum  int32  `json:"groupPriorityMinimum"`
	VersionPriority       int32  `json:"versionPriority"`
	InsecureSkipTLSVerify bool   `json:"insecureSkipTLSVerify,omitempty"`
	CABundle              []byte `json:"caBundle,omitempty"`
	Service               *struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
		Port      *int32 `json:"port"`
	} `json:"service"`
}

// TestInstallManifestsAreConsistent checks the references between the
// objects: ServiceAccounts, Service selectors and ports, the APIService and
// the webhooks' Services and paths, and the signing key Secret's name.
func TestInstallManifestsAreConsistent(t *testing.T) {
	docs := readInstallManifests(t)
	for _, d := range docs {
		var meta struct {
			Metadata struct{ Namespace string } `json:"metadata"`
		}
		_ = yaml.Unmarshal(d.raw, &meta)
		if ns := meta.Metadata.Namespace; ns != "" && ns != installNamespace && !(d.kind == "RoleBinding" && ns == "kube-system") {
			t.Errorf("%s: %s in namespace %s, want %s", d.file, d.kind, ns, installNamespace)
		}
	}
	sas := map[string]bool{}
	for _, sa := range decodeAll[corev1.ServiceAccount](t, docs, "ServiceAccount") {
		sas[sa.Name] = true
	}
	deployments := decodeAll[appsv1.Deployment](t, docs, "Deployment")
	services := map[string]corev1.Service{}
	for _, s := range decodeAll[corev1.Service](t, docs, "Service") {
		services[s.Name] = s
	}
	for _, d := range deployments {
		if !sas[d.Spec.Template.Spec.ServiceAccountName] {
			t.Errorf("Deployment %s runs as ServiceAccount %q, not in the manifests", d.Name, d.Spec.Template.Spec.ServiceAccountName)
		}
		for k, v := range d.Spec.Selector.MatchLabels {
			if d.Spec.Template.Labels[k] != v {
				t.Errorf("Deployment %s: selector %s=%s does not match its pod labels", d.Name, k, v)
			}
		}
	}
	// Each Service selects exactly one Deployment's pods and targets a named port.
	for _, s := range services {
		var matched []string
		for _, d := range deployments {
			ok := len(s.Spec.Selector) > 0
			for k, v := range s.Spec.Selector {
				ok = ok && d.Spec.Template.Labels[k] == v
			}
			if !ok {
				continue
			}
			matched = append(matched, d.Name)
			for _, p := range s.Spec.Ports {
				found := false
				for _, c := range d.Spec.Template.Spec.Containers {
					for _, cp := range c.Ports {
						found = found || cp.Name == p.TargetPort.String() || cp.ContainerPort == p.TargetPort.IntVal
					}
				}
				if !found {
					t.Errorf("Service %s port %d targets %s, which Deployment %s does not expose", s.Name, p.Port, p.TargetPort.String(), d.Name)
				}
			}
		}
		if len(matched) != 1 {
			t.Errorf("Service %s selects Deployments %v, want exactly one", s.Name, matched)
		}
	}
	for _, want := range []string{"kubefill-api", "kubefill-uploadproxy"} {
		if _, ok := services[want]; !ok {
			t.Errorf("no Service %s", want)
		}
	}
	servicePort := func(what string, ref *admissionregistrationv1.ServiceReference) {
		s, ok := services[ref.Name]
		if !ok || ref.Namespace != installNamespace {
			t.Errorf("%s: Service %s/%s not in the manifests", what, ref.Namespace, ref.Name)
			return
		}
		for _, p := range s.Spec.Ports {
			if ref.Port != nil && p.Port == *ref.Port {
				return
			}
		}
		t.Errorf("%s: Service %s has no port %v", what, ref.Name, ref.Port)
	}
	apisvcs := decodeAll[apiService](t, docs, "APIService")
	if len(apisvcs) != 1 || apisvcs[0].Metadata["name"] != "v1beta1.upload.cdi.kubevirt.io" {
		t.Fatalf("APIServices %v, want v1beta1.upload.cdi.kubevirt.io", apisvcs)
	}
	a := apisvcs[0]
	if a.Spec.Group != "upload.cdi.kubevirt.io" || a.Spec.Version != "v1beta1" || a.Spec.Service == nil {
		t.Errorf("APIService spec %+v", a.Spec)
	} else {
		servicePort("APIService", &admissionregistrationv1.ServiceReference{Namespace: a.Spec.Service.Namespace, Name: a.Spec.Service.Name, Port: a.Spec.Service.Port})
	}
	paths := map[string]string{}
	for _, v := range decodeAll[admissionregistrationv1.ValidatingWebhookConfiguration](t, docs, "ValidatingWebhookConfiguration") {
		for _, w := range v.Webhooks {
			servicePort(w.Name, w.ClientConfig.Service)
			paths[w.Name] = *w.ClientConfig.Service.Path
		}
	}
	for _, m := range decodeAll[admissionregistrationv1.MutatingWebhookConfiguration](t, docs, "MutatingWebhookConfiguration") {
		for _, w := range m.Webhooks {
			servicePort(w.Name, w.ClientConfig.Service)
			paths[w.Name] = *w.ClientConfig.Service.Path
		}
	}
	for name, want := range map[string]string{
		"datavolume-validate.cdi.kubevirt.io":     admission.PathDataVolumeValidate,
		"datavolume-mutate.cdi.kubevirt.io":       admission.PathDataVolumeMutate,
		"populator-validate.cdi.kubevirt.io":      admission.PathPopulatorValidate,
		"dataimportcron-validate.cdi.kubevirt.io": admission.PathDataImportCronValidate,
	} {
		if paths[name] != want {
			t.Errorf("webhook %s path %q, want %q (pkg/apiserver/admission/review.go)", name, paths[name], want)
		}
	}
	// The apiserver may read and update only its signing key Secret by name.
	// The controller may patch exactly the Deployments CDI.spec.infra places,
	// which are the manifests'.
	names := map[string]bool{}
	for _, d := range deployments {
		names[d.Name] = true
	}
	for _, name := range controller.InfraDeploymentNames {
		if !names[name] {
			t.Errorf("the CDI controller places Deployment %s, which is not in the manifests", name)
		}
	}
	var patchable []string
	for _, r := range decodeAll[rbacv1.Role](t, docs, "Role") {
		for _, rule := range r.Rules {
			if slices.Contains(rule.Resources, "secrets") && len(rule.ResourceNames) > 0 && !slices.Contains(rule.ResourceNames, token.DefaultSigningKeySecretName) {
				t.Errorf("Role %s names Secrets %v, not %s", r.Name, rule.ResourceNames, token.DefaultSigningKeySecretName)
			}
			if slices.Contains(rule.Resources, "deployments") && slices.ContainsFunc(rule.Verbs, func(v string) bool { return v != "get" && v != "list" && v != "watch" }) {
				if len(rule.ResourceNames) == 0 {
					t.Errorf("Role %s may %v every Deployment, want only %v by name", r.Name, rule.Verbs, controller.InfraDeploymentNames)
				}
				patchable = append(patchable, rule.ResourceNames...)
			}
		}
	}
	slices.Sort(patchable)
	wantPatchable := slices.Sorted(slices.Values(controller.InfraDeploymentNames))
	if !slices.Equal(patchable, wantPatchable) {
		t.Errorf("Roles may write Deployments %v, want exactly %v", patchable, wantPatchable)
	}
}

// TestKustomizationListsEveryManifest: kustomization.yaml names each file of
// the directory that belongs to the base install, and every CRD once.
func TestKustomizationListsEveryManifest(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(installDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct{ Resources []string }
	if err := yaml.UnmarshalStrict(b, &struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}{}); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, r := range k.Resources {
		if listed[r] {
			t.Errorf("%s listed twice", r)
		}
		listed[r] = true
		if _, err := os.Stat(filepath.Join(installDir, r)); err != nil {
			t.Errorf("kustomization.yaml lists %s: %v", r, err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(installDir, "*.yaml"))
	for _, f := range files {
		base := filepath.Base(f)
		// cert-manager.yaml is optional: it needs cert-manager's CRDs.
		if base != "kustomization.yaml" && base != "cert-manager.yaml" && !listed[base] {
			t.Errorf("%s is not in kustomization.yaml", base)
		}
	}
	if k.Resources[0] != "namespace.yaml" {
		t.Errorf("first resource %s, want namespace.yaml", k.Resources[0])
	}
	// The top level adds every CRD and install/ (kustomize loads no file
	// from outside a kustomization's own directory).
	top, err := os.ReadFile(filepath.Join(installDir, "..", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var tk struct{ Resources []string }
	if err := yaml.Unmarshal(top, &tk); err != nil {
		t.Fatal(err)
	}
	want := []string{"install"}
	crds, _ := filepath.Glob(filepath.Join(installDir, "..", "crd", "*.yaml"))
	for _, f := range crds {
		want = append(want, path.Join("crd", filepath.Base(f)))
	}
	slices.Sort(want)
	got := slices.Sorted(slices.Values(tk.Resources))
	if !slices.Equal(got, want) {
		t.Errorf("manifests/kustomization.yaml lists %v, want %v", got, want)
	}
}
