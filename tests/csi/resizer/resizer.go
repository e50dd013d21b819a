// Package resizer is the local cluster's stand-in for the CSI
// external-resizer sidecar: it grows the volumes of claims whose request
// exceeds their capacity, through the driver's ControllerExpandVolume, then
// records the new size on the PV and in the claim's status, as the real
// sidecar does for a driver that needs no node expansion. The real one is
// not among the sidecars hack/sidecars.sh builds.
//
// It is test infrastructure: the product binary never links it.
package resizer

import (
	"context"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Resizer expands the volumes of one CSI driver.
type Resizer struct {
	Client kubernetes.Interface
	// Driver is the CSI driver name whose PVs it handles.
	Driver string
	// Endpoint is the driver's unix socket.
	Endpoint string
	// Interval is how often it looks for claims to grow; 500 ms if zero.
	Interval time.Duration
	// Logf receives one line per expansion and per error.
	Logf func(format string, args ...any)
}

// Run polls until ctx ends.
func (r *Resizer) Run(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+r.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial CSI driver at %s: %w", r.Endpoint, err)
	}
	defer conn.Close()
	ctl := csi.NewControllerClient(conn)
	interval := r.Interval
	if interval <= 0 {
		interval = 500 * time.Millisecond
	}
	logf := r.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	for {
		if err := r.pass(ctx, ctl, logf); err != nil && ctx.Err() == nil {
			logf("resizer: %v", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// pass grows every bound claim of the driver whose request exceeds its capacity.
func (r *Resizer) pass(ctx context.Context, ctl csi.ControllerClient, logf func(string, ...any)) error {
	claims, err := r.Client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range claims.Items {
		pvc := &claims.Items[i]
		want, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
		have, known := pvc.Status.Capacity[corev1.ResourceStorage]
		if !ok || !known || pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" || want.Cmp(have) <= 0 || pvc.DeletionTimestamp != nil {
			continue
		}
		if err := r.expand(ctx, ctl, pvc, want); err != nil {
			logf("resizer: %s/%s to %s: %v", pvc.Namespace, pvc.Name, want.String(), err)
			continue
		}
		logf("resizer: %s/%s grown from %s to %s", pvc.Namespace, pvc.Name, have.String(), want.String())
	}
	return nil
}

func (r *Resizer) expand(ctx context.Context, ctl csi.ControllerClient, pvc *corev1.PersistentVolumeClaim, want resource.Quantity) error {
	pvs := r.Client.CoreV1().PersistentVolumes()
	pv, err := pvs.Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != r.Driver {
		return nil
	}
	size := want.Value()
	var capability *csi.VolumeCapability
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		capability = &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}
	} else {
		capability = &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}
	}
	capability.AccessMode = &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := ctl.ControllerExpandVolume(cctx, &csi.ControllerExpandVolumeRequest{
		VolumeId: pv.Spec.CSI.VolumeHandle, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: capability,
	})
	if err != nil {
		return fmt.Errorf("ControllerExpandVolume: %w", err)
	}
	got := *resource.NewQuantity(resp.GetCapacityBytes(), resource.BinarySI)
	if got.Cmp(want) < 0 {
		got = want
	}
	if cur := pv.Spec.Capacity[corev1.ResourceStorage]; cur.Cmp(got) < 0 {
		pv.Spec.Capacity[corev1.ResourceStorage] = got
		if _, err := pvs.Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("recording the size on PV %s: %w", pv.Name, err)
		}
	}
	pvc.Status.Capacity[corev1.ResourceStorage] = got
	pvc.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: got}
	pvc.Status.Conditions = nil
	pvc.Status.AllocatedResourceStatuses = nil
	if _, err := r.Client.CoreV1().PersistentVolumeClaims(pvc.Namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("recording the size in the claim's status: %w", err)
	}
	return nil
}
