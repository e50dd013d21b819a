package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/tests/kit"
)

var dataVolumeGVR = schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datavolumes"}

// demoDisk is the qcow2 both demos use: where it is, its virtual size and
// the sha256 of what qemu-img converts it to.
type demoDisk struct {
	path string
	size int64
	sha  string
}

// demoImage writes a compressed qcow2 with scattered data into dir and
// returns its name, its virtual size and the sha256 of the raw bytes that
// qemu-img converts it to.
func demoImage(dir string) (string, int64, string, error) {
	raw := filepath.Join(dir, "src.raw")
	const size = 32 << 20
	f, err := os.Create(raw)
	if err != nil {
		return "", 0, "", err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return "", 0, "", err
	}
	chunk := make([]byte, 1<<20)
	for i, off := range []int64{0, 3 << 20, 11 << 20, size - 1<<20} {
		for j := range chunk {
			chunk[j] = byte((j*13 + i*71) ^ (j >> 8))
		}
		if _, err := f.WriteAt(chunk, off); err != nil {
			f.Close()
			return "", 0, "", err
		}
	}
	if err := f.Close(); err != nil {
		return "", 0, "", err
	}
	qcow := filepath.Join(dir, "disk.qcow2")
	expected := filepath.Join(dir, "expected.raw")
	for _, args := range [][]string{
		{"convert", "-f", "raw", "-O", "qcow2", "-c", raw, qcow},
		{"convert", "-f", "qcow2", "-O", "raw", qcow, expected},
	} {
		if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
			return "", 0, "", fmt.Errorf("qemu-img %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	sum, err := fileSHA256(expected)
	return "disk.qcow2", size, sum, err
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// runImportDemo is the main job's import: a DataVolume imports a small
// qcow2 served over HTTP (from this process, at the node address where pods
// reach the host, and nowhere else) through Kubefill's controller and worker pod; its phase and
// progress are printed as they change, and a pod checks the bytes.
func runImportDemo(ctx context.Context, cfg *rest.Config, client kubernetes.Interface, hostAddr string, disk demoDisk) error {
	dir, name, size, want := filepath.Dir(disk.path), filepath.Base(disk.path), disk.size, disk.sha
	ln, err := net.Listen("tcp", net.JoinHostPort(hostAddr, "0"))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(dir)), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := fmt.Sprintf("http://%s/%s", ln.Addr().String(), name)

	dvName := fmt.Sprintf("demo-import-%d", time.Now().Unix())
	dv := &cdiv1.DataVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: "cdi.kubevirt.io/v1beta1", Kind: "DataVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: dvName, Namespace: demoNamespace},
		Spec: cdiv1.DataVolumeSpec{
			Source: &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: url}},
			PVC: &corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				VolumeMode:  ptr.To(corev1.PersistentVolumeFilesystem),
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
			},
		},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(dv)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := dyn.Resource(dataVolumeGVR).Namespace(demoNamespace).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create DataVolume: %w", err)
	}
	fmt.Printf("DataVolume %s/%s: importing %s (qcow2 of a %d MiB disk)\n", demoNamespace, dvName, url, size>>20)
	last := ""
	var got cdiv1.DataVolume
	if err := poll(ctx, func() (bool, error) {
		u, err := dyn.Resource(dataVolumeGVR).Namespace(demoNamespace).Get(ctx, dvName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &got); err != nil {
			return false, err
		}
		step := fmt.Sprintf("phase %s, progress %s", got.Status.Phase, got.Status.Progress)
		if step != last && got.Status.Phase != "" {
			fmt.Printf("  %6.1fs  %s\n", time.Since(start).Seconds(), step)
			last = step
		}
		return kit.Terminal(got.Status.Phase), nil
	}); err != nil {
		return fmt.Errorf("DataVolume %s did not finish: %w", dvName, err)
	}
	if got.Status.Phase != cdiv1.Succeeded {
		for _, c := range got.Status.Conditions {
			fmt.Printf("  condition %s=%s %s: %s\n", c.Type, c.Status, c.Reason, c.Message)
		}
		return fmt.Errorf("DataVolume %s ended %s", dvName, got.Status.Phase)
	}
	return checkClaimBytes(ctx, client, dvName, size, want)
}

// checkClaimBytes has a pod read the first size bytes of the claim's
// disk.img and compares their sha256 with want.
func checkClaimBytes(ctx context.Context, client kubernetes.Interface, claim string, size int64, want string) error {
	read, err := runDemoPod(ctx, client, claim+"-check", claim,
		fmt.Sprintf("head -c %d /data/disk.img | sha256sum | cut -d' ' -f1 > /dev/termination-log", size))
	if err != nil {
		return err
	}
	read = strings.TrimSpace(read)
	if read != want {
		return fmt.Errorf("the claim holds sha256 %s, qemu-img converts the image to %s", read, want)
	}
	fmt.Printf("bytes check: the claim's disk.img has sha256 %s, the same as qemu-img's conversion of the image\n", read)
	return nil
}
