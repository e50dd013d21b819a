package cloneauth

import (
	"context"
	"errors"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/token"
)

// A DataImportCron's imports are DataVolumes the controller creates, so
// their clones are authorised not for the controller but for the cron's
// ServiceAccount (spec.serviceAccountName, default "default", in the cron's
// namespace), as in CDI since #3970. The cron's admission webhook, the
// controller before each import, and the DataVolume webhook when the
// controller creates an import all ask AuthorizeCron or CronUser.

// ErrCronSourceRef is CronCloneSource's error for a template with a
// sourceRef: a cron's imports never resolve DataSources (the cron's
// webhook refuses the field).
var ErrCronSourceRef = errors.New("the template sets spec.sourceRef, which a DataImportCron may not use (its imports never resolve DataSources)")

// CronCloneSource is what each import of cron clones: its template's pvc
// or snapshot source, the namespace defaulting to the cron's; nil when the
// imports clone nothing (a registry source). Pure.
func CronCloneSource(cron *cdiv1.DataImportCron) (*Source, error) {
	t := &cron.Spec.Template.Spec
	if t.SourceRef != nil {
		return nil, ErrCronSourceRef
	}
	if t.Source == nil {
		return nil, nil
	}
	ns := func(s string) string {
		if s == "" {
			return cron.Namespace
		}
		return s
	}
	switch {
	case t.Source.PVC != nil:
		return &Source{Resource: token.ResourcePVC, Namespace: ns(t.Source.PVC.Namespace), Name: t.Source.PVC.Name}, nil
	case t.Source.Snapshot != nil:
		return &Source{Resource: token.ResourceVolumeSnapshot, Namespace: ns(t.Source.Snapshot.Namespace), Name: t.Source.Snapshot.Name}, nil
	}
	return nil, nil
}

// CronUser is the identity a cron's clones are authorised for: its
// ServiceAccount, as kube-apiserver would authenticate it.
func CronUser(cron *cdiv1.DataImportCron) authenticationv1.UserInfo {
	return ServiceAccountUser(cron.Namespace, cron.CloneServiceAccount())
}

// CronRefusal is the message of a cron whose ServiceAccount may not clone:
// the cron, the ServiceAccount and where it comes from, then reason (which
// names the missing permission), then what to do. Pure.
func CronRefusal(cron *cdiv1.DataImportCron, src Source, reason string) string {
	sa := cron.CloneServiceAccount()
	from := "spec.serviceAccountName"
	if cron.Spec.ServiceAccountName == nil || *cron.Spec.ServiceAccountName == "" {
		from = "spec.serviceAccountName is unset, so the namespace's default"
	}
	return fmt.Sprintf("DataImportCron %s/%s clones %s/%s as ServiceAccount %s/%s (%s): %s; grant that ServiceAccount the permission in namespace %q (a RoleBinding there), or name one that has it in spec.serviceAccountName",
		cron.Namespace, cron.Name, src.Namespace, src.Name, cron.Namespace, sa, from, reason, src.Namespace)
}

// AuthorizeCron returns whether cron's ServiceAccount may clone the source
// of its imports and, if not, a message naming the cron, the
// ServiceAccount and the missing permission (CronRefusal). A cron whose
// imports clone nothing is allowed without a review; one whose template
// cannot be a cron's (ErrCronSourceRef) is refused.
func (a Authorizer) AuthorizeCron(ctx context.Context, cron *cdiv1.DataImportCron) (bool, string, error) {
	src, err := CronCloneSource(cron)
	if err != nil {
		return false, fmt.Sprintf("DataImportCron %s/%s: %v", cron.Namespace, cron.Name, err), nil
	}
	if src == nil {
		return true, "", nil
	}
	if src.Name == "" {
		return false, fmt.Sprintf("DataImportCron %s/%s: the template's clone source names no object", cron.Namespace, cron.Name), nil
	}
	ok, reason, err := a.Authorize(ctx, CronUser(cron), *src)
	if err != nil || ok {
		return ok, "", err
	}
	return false, CronRefusal(cron, *src, reason), nil
}
