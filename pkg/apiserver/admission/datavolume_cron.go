package admission

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/cloneauth"
)

// DefaultControllerUser is the controller's identity in an install
// namespace: ServiceAccount kubefill-controller there.
func DefaultControllerUser(installNamespace string) string {
	return "system:serviceaccount:" + installNamespace + ":kubefill-controller"
}

// authorizeClone authorises the clone of src that the DataVolume dv, asked
// for by req, would make, and returns the identity it was authorised for.
// That is the requester, except when the requester is the controller
// (ControllerUser): the controller creates clone DataVolumes only as a
// DataImportCron's imports, so the clone is authorised for that cron's
// ServiceAccount, and a clone DataVolume the controller asks for that no
// cron of its namespace accounts for is refused. The controller never
// clones on its own authority.
//
// The cron is the one the DataVolume's cdi.kubevirt.io/dataImportCron label
// names, in the DataVolume's namespace: the controller sets that label on
// every import (CDI's), and it is the controller's word here since the
// controller made the request. Imports carry no ownerReference to their
// cron, as in CDI: with retentionPolicy All they outlive it.
func (m *DataVolumeMutator) authorizeClone(ctx context.Context, req *admissionv1.AdmissionRequest, dv *cdiv1.DataVolume, src cloneauth.Source) (authenticationv1.UserInfo, bool, string, error) {
	auth := cloneauth.Authorizer{Client: m.Client}
	if m.ControllerUser == "" || req.UserInfo.Username != m.ControllerUser {
		ok, reason, err := auth.Authorize(ctx, req.UserInfo, src)
		return req.UserInfo, ok, reason, err
	}
	name := dv.Labels[cdiv1.LabelDataImportCron]
	if name == "" {
		return req.UserInfo, false, fmt.Sprintf("the controller (%s) asked for DataVolume %s/%s cloning %s/%s, which no DataImportCron accounts for (no %s label): "+
			"the controller clones only for a DataImportCron, as the cron's ServiceAccount, never on its own authority",
			m.ControllerUser, dv.Namespace, dv.Name, src.Namespace, src.Name, cdiv1.LabelDataImportCron), nil
	}
	cron := &cdiv1.DataImportCron{}
	if err := m.Client.Get(ctx, types.NamespacedName{Namespace: dv.Namespace, Name: name}, cron); err != nil {
		if apierrors.IsNotFound(err) {
			return req.UserInfo, false, fmt.Sprintf("the controller (%s) asked for DataVolume %s/%s cloning %s/%s for DataImportCron %s/%s, which does not exist: "+
				"the controller clones only for an existing DataImportCron, as its ServiceAccount", m.ControllerUser, dv.Namespace, dv.Name, src.Namespace, src.Name, dv.Namespace, name), nil
		}
		return req.UserInfo, false, "", fmt.Errorf("reading DataImportCron %s/%s, which DataVolume %s/%s is an import of: %w", dv.Namespace, name, dv.Namespace, dv.Name, err)
	}
	user := cloneauth.CronUser(cron)
	ok, reason, err := auth.Authorize(ctx, user, src)
	if err != nil || ok {
		return user, ok, "", err
	}
	return user, false, cloneauth.CronRefusal(cron, src, reason), nil
}
