package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/internal/registry"
	"github.com/kubefill/kubefill/tests/kit"
)

// TestImportFromInsecureRegistry (C10): a DataVolume importing from a
// registry with a self-signed certificate fails on the certificate, and
// imports once CDIConfig lists the registry (host:port) in
// spec.insecureRegistries. The registry is the test's own, on a port of its
// own, so listing it changes nothing for the other tests.
func TestImportFromInsecureRegistry(t *testing.T) {
	parallel(t)
	c := shared.c
	gw, err := cl.GatewayAddress()
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.Start(t, registry.Options{Address: gw, TLS: true})
	disk, sha := goldenDisk(11)
	reg.PushDisk(t, "containerdisks/insecure:1", disk)
	ns := newNamespace(t)
	source := &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To(reg.URL("containerdisks/insecure:1"))}}

	refused := kit.DataVolume(ns, "refused", source, kit.WithPVC(filesystemClaim("64Mi")))
	if err := c.Create(context.Background(), refused); err != nil {
		t.Fatal(err)
	}
	kit.WaitDataVolume(t, c, ns, refused.Name, 3*time.Minute, func(dv *cdiv1.DataVolume) bool {
		return slices.ContainsFunc(dv.Status.Conditions, func(cond cdiv1.DataVolumeCondition) bool {
			return strings.Contains(cond.Message, "certificate")
		})
	})
	if err := c.Delete(context.Background(), refused); err != nil {
		t.Fatal(err)
	}

	listInsecureRegistry(t, c, reg.Host)
	dv := kit.DataVolume(ns, "listed", source, kit.WithPVC(filesystemClaim("64Mi")))
	if err := c.Create(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	got, _ := kit.WaitDataVolumeTerminal(t, c, ns, dv.Name, 5*time.Minute)
	if got.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("ended %s: %+v\nevents:\n%s", got.Status.Phase, got.Status.Conditions, eventsFor(ns, dv.Name))
	}
	if sum := claimSHA256(t, ns, dv.Name, int64(len(disk))); sum != sha {
		t.Errorf("the claim holds sha256 %s, the image is %s", sum, sha)
	}
}

// listInsecureRegistry lists host in CDIConfig's insecureRegistries until
// the test ends.
func listInsecureRegistry(t *testing.T, c client.Client, host string) {
	t.Helper()
	change := func(add bool) func(*cdiv1.CDIConfigSpec) bool {
		return func(spec *cdiv1.CDIConfigSpec) bool {
			if slices.Contains(spec.InsecureRegistries, host) == add {
				return true
			}
			spec.InsecureRegistries = slices.DeleteFunc(slices.Clone(spec.InsecureRegistries), func(s string) bool { return s == host })
			if add {
				spec.InsecureRegistries = append(spec.InsecureRegistries, host)
			}
			return false
		}
	}
	editConfigSpec(t, c, "insecureRegistries to list "+host, change(true))
	t.Cleanup(func() { editConfigSpec(t, c, "insecureRegistries to drop "+host, change(false)) })
}

// editConfigSpec applies change to CDIConfig's spec (through the CDI
// resource when it is the config's authority) until CDIConfig's spec shows
// it: change says whether spec already does, else changes it.
func editConfigSpec(t *testing.T, c client.Client, what string, change func(*cdiv1.CDIConfigSpec) (done bool)) {
	t.Helper()
	ctx := context.Background()
	edit := func() error {
		cdis := &cdiv1.CDIList{}
		if err := c.List(ctx, cdis); err != nil {
			return err
		}
		if _, authoritative, err := controller.ConfigSpecFromCDI(cdis.Items); err == nil && authoritative {
			for i := range cdis.Items {
				cr := &cdis.Items[i]
				if _, ok := cr.Annotations[controller.AnnConfigAuthority]; !ok {
					continue
				}
				if cr.Spec.Config == nil {
					cr.Spec.Config = &cdiv1.CDIConfigSpec{}
				}
				change(cr.Spec.Config)
				return c.Update(ctx, cr)
			}
		}
		config := &cdiv1.CDIConfig{}
		if err := c.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); err != nil {
			return err
		}
		change(&config.Spec)
		return c.Update(ctx, config)
	}
	// Tried again on a conflict: the controller writes the CDI resource and
	// CDIConfig too.
	kit.Eventually(t, time.Minute, time.Second, what, func() (bool, string, error) {
		config := &cdiv1.CDIConfig{}
		if err := c.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); err != nil {
			return false, "", client.IgnoreNotFound(err)
		}
		if change(config.Spec.DeepCopy()) {
			return true, "", nil
		}
		if err := edit(); err != nil && !apierrors.IsConflict(err) {
			return false, "", err
		}
		return false, fmt.Sprintf("spec %+v", config.Spec), nil
	})
}
