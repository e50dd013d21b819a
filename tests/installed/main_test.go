// Package installed installs Kubefill from manifests/ onto a local cluster
// with a real node (tests/cluster), as `kubectl apply -k manifests` would,
// with the image built here, and runs a smoke set against the installed
// components: the controller, the API server and the upload proxy as
// Deployments, reached through their Services, the APIService and the
// webhook configurations, with the certificates the controller makes.
// Nothing of Kubefill runs in the test process.
package installed

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/cluster"
)

const (
	// installNS is the manifests' namespace.
	installNS = "kubefill-system"
	// image is the one the node has (hack/images.sh), put in place of the
	// one the manifests name as a kustomize image override would (and in
	// --worker-image, which must stay equal to it).
	image        = "kubefill/kubefill:e2e"
	fieldManager = "kubefill-installed-test"
)

var (
	cl        *cluster.Cluster
	kc        client.Client
	dyn       dynamic.Interface
	installer *cluster.Installer
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
	// On the cluster hack/test.sh shares with tests/load, or one of its own.
	c, err := cluster.StartOrAttach(context.Background(), cluster.Options{Storage: true, Node: true, Logf: log.Printf,
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
		before, err := namespaceNames(context.Background())
		if err != nil {
			fmt.Fprintln(os.Stderr, "installed:", err)
			return 1
		}
		code := m.Run()
		if code != 0 {
			fmt.Fprint(os.Stderr, diagnose(context.Background()))
		}
		if c.Attached() {
			// The next package on the shared cluster runs Kubefill its own way,
			// and must find nothing of these tests for it to finish: their
			// namespaces go while the installed controller still runs.
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			if err := waitNamespacesGone(ctx, before); err != nil {
				fmt.Fprintf(os.Stderr, "installed: %v\n%s", err, diagnose(context.Background()))
				return 1
			}
			fmt.Printf("installed: the tests' namespaces gone %s after the tests\n", time.Since(t0).Round(time.Millisecond))
			if err := installer.Uninstall(ctx); err != nil {
				fmt.Fprintf(os.Stderr, "installed: uninstall: %v\n", err)
				return 1
			}
			fmt.Printf("installed: uninstalled, the CRDs kept, in %s\n", time.Since(t0).Round(time.Millisecond))
		}
		return code
	}()
	signal.Stop(sigs)
	if err := c.StopAndCheck(); err != nil {
		fmt.Fprintf(os.Stderr, "installed: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// namespaceNames lists the cluster's namespaces.
func namespaceNames(ctx context.Context) (map[string]bool, error) {
	list := &corev1.NamespaceList{}
	if err := kc.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	names := map[string]bool{}
	for _, ns := range list.Items {
		names[ns.Name] = true
	}
	return names, nil
}

// waitNamespacesGone waits until no namespace but those in before is left:
// the tests delete theirs as they end, and the deletions finish in the
// background.
func waitNamespacesGone(ctx context.Context, before map[string]bool) error {
	for {
		now, err := namespaceNames(ctx)
		if err != nil {
			return err
		}
		var left []string
		for name := range now {
			if !before[name] {
				left = append(left, name)
			}
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the tests' namespaces %v are not gone: %w", left, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// repoRoot is the top of the checkout.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// install applies the manifests server-side, as `kubectl apply -k
// manifests` would, with the image override (cluster.Installer, which `make
// dev INSTALLED=1` uses too), and waits for the Deployments and the
// APIService.
func install(ctx context.Context) error {
	in, err := cl.NewInstaller(cluster.InstallOptions{Image: image, FieldManager: fieldManager, Logf: log.Printf})
	if err != nil {
		return err
	}
	installer = in
	return in.Install(ctx)
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
	return cluster.GetCDIAndDeployments(ctx, dyn, ns)
}
