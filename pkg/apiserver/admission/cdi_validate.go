package admission

import (
	"context"
	"encoding/json"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// PathCDIValidate is CDI's path of the webhook that guards deleting the CDI resource.
const PathCDIValidate = "/cdi-validate"

// uninstallBlockedMessage is CDI's refusal, with the number of DataVolumes
// found (at most 2: the webhook only needs to know there are some).
const uninstallBlockedMessage = "rejecting the uninstall request, since there are still %d DataVolumes present. Either delete all DataVolumes or change the uninstall strategy before uninstalling CDI"

// CDIValidator is the cdi-validate webhook: with uninstallStrategy
// BlockUninstallIfWorkloadsExist, deleting the CDI resource is refused while
// any DataVolume not made by a DataImportCron exists. A resource in phase ""
// or Error (never deployed, or not the honoured one) is always deletable.
type CDIValidator struct {
	Client client.Client
}

// BlocksUninstall decides: whether deleting cdi must wait for the
// DataVolumes (count, those found) to go.
func BlocksUninstall(cdi *cdiv1.CDI, dataVolumes int) bool {
	switch cdi.Status.Phase {
	case cdiv1.CDIPhaseEmpty, cdiv1.CDIPhaseError:
		return false
	}
	return cdi.Spec.UninstallStrategy != nil && *cdi.Spec.UninstallStrategy == cdiv1.CDIUninstallStrategyBlockUninstallIfWorkloadsExist && dataVolumes > 0
}

// Admit implements AdmitFunc.
func (v *CDIValidator) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Resource.Group != cdiv1.GroupName || req.Resource.Resource != "cdis" {
		return badRequest(fmt.Sprintf("this webhook validates cdis.%s, not %s.%s", cdiv1.GroupName, req.Resource.Resource, req.Resource.Group))
	}
	if req.Operation != admissionv1.Delete {
		return allowed()
	}
	cdi := &cdiv1.CDI{}
	switch {
	case len(req.OldObject.Raw) > 0:
		if err := json.Unmarshal(req.OldObject.Raw, cdi); err != nil {
			return badRequest(fmt.Sprintf("decoding the CDI resource being deleted: %v", err))
		}
	case req.Name != "":
		if err := v.Client.Get(ctx, types.NamespacedName{Name: req.Name}, cdi); err != nil {
			return internalError(fmt.Errorf("reading CDI %s being deleted: %w", req.Name, err))
		}
	default:
		return badRequest("cannot tell which CDI resource is being deleted: the request has neither oldObject nor name")
	}
	if !BlocksUninstall(cdi, 1) {
		return allowed()
	}
	notCron, err := labels.NewRequirement(cdiv1.LabelDataImportCron, selection.DoesNotExist, nil)
	if err != nil {
		return internalError(err)
	}
	var dvs cdiv1.DataVolumeList
	if err := v.Client.List(ctx, &dvs, client.MatchingLabelsSelector{Selector: labels.NewSelector().Add(*notCron)}, client.Limit(2)); err != nil {
		return internalError(fmt.Errorf("listing DataVolumes to decide whether CDI %s may be deleted: %w", cdi.Name, err))
	}
	if BlocksUninstall(cdi, len(dvs.Items)) {
		return forbidden(fmt.Sprintf(uninstallBlockedMessage, len(dvs.Items)))
	}
	return allowed()
}
