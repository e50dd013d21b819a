package admission

import (
	"context"
	"encoding/json"
	"fmt"

	cronexpr "github.com/robfig/cron/v3"
	admissionv1 "k8s.io/api/admission/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/cloneauth"
)

// PathDataImportCronValidate is CDI's path of the DataImportCron validating
// webhook (configuration cdi-api-dataimportcron-validate).
const PathDataImportCronValidate = "/dataimportcron-validate"

// CDI's messages for a DataImportCron it refuses; each is the detail of the
// field error, so it appears in the message kubectl shows.
const (
	msgCronSpecImmutable   = "Cannot update DataImportCron Spec"
	msgCronMissingSource   = "Missing source: the template needs spec.source.registry or spec.source.pvc"
	msgCronUnsettable      = "Unsettable fields: SourceRef, ContentType, Checkpoints, FinalCheckpoint"
	msgCronIllegalSchedule = "Illegal cron schedule"
	msgCronImportsToKeep   = "Illegal ImportsToKeep value"
	msgCronGarbageCollect  = "Illegal GarbageCollect value"
	msgCronRetention       = "Illegal RetentionPolicy value"
	msgCronManagedDS       = "Illegal ManagedDataSource value"
)

// ValidateDataImportCron checks a new DataImportCron as CDI's webhook does:
// the cron's and the managed DataSource's names are DNS-1035 labels (the
// imports are named <managedDataSource>-<12 digest characters>, the poller's
// CronJob after the cron), the template imports from a registry or a pvc and
// sets none of sourceRef, contentType, checkpoints and finalCheckpoint, and
// is otherwise a valid DataVolume spec; the schedule, when set, is a
// standard 5-field cron expression; importsToKeep is not negative. Every
// problem is reported, not only the first. Pure.
func ValidateDataImportCron(cron *cdiv1.DataImportCron) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateDNS1035(cron.Name, field.NewPath("metadata", "name"))...)
	spec := field.NewPath("spec")
	tmpl := spec.Child("template", "spec")
	t := &cron.Spec.Template.Spec
	if src := t.Source; src == nil || (src.Registry == nil && src.PVC == nil) {
		errs = append(errs, field.Required(tmpl.Child("source"), msgCronMissingSource))
	}
	if t.SourceRef != nil {
		errs = append(errs, field.Forbidden(tmpl.Child("sourceRef"), msgCronUnsettable))
	}
	if t.ContentType != "" {
		errs = append(errs, field.Forbidden(tmpl.Child("contentType"), msgCronUnsettable))
	}
	if len(t.Checkpoints) > 0 {
		errs = append(errs, field.Forbidden(tmpl.Child("checkpoints"), msgCronUnsettable))
	}
	if t.FinalCheckpoint {
		errs = append(errs, field.Forbidden(tmpl.Child("finalCheckpoint"), msgCronUnsettable))
	}
	if len(errs) == 0 {
		// The rest of the DataVolume rules, once the source is one a cron takes.
		errs = append(errs, ValidateDataVolumeSpec(t, tmpl)...)
	}
	if s := cron.Spec.Schedule; s != "" {
		if _, err := cronexpr.ParseStandard(s); err != nil {
			errs = append(errs, field.Invalid(spec.Child("schedule"), s,
				fmt.Sprintf("%s (%v): use 5 fields, minute hour day-of-month month day-of-week, e.g. \"0 */12 * * *\"", msgCronIllegalSchedule, err)))
		}
	}
	if n := cron.Spec.ImportsToKeep; n != nil && *n < 0 {
		errs = append(errs, field.Invalid(spec.Child("importsToKeep"), *n, msgCronImportsToKeep+": must be 0 or more"))
	}
	if gc := cron.Spec.GarbageCollect; gc != nil && *gc != cdiv1.DataImportCronGarbageCollectNever && *gc != cdiv1.DataImportCronGarbageCollectOutdated {
		errs = append(errs, field.NotSupported(spec.Child("garbageCollect"), *gc,
			[]string{string(cdiv1.DataImportCronGarbageCollectOutdated), string(cdiv1.DataImportCronGarbageCollectNever)}))
		errs[len(errs)-1].Detail = msgCronGarbageCollect + ": " + errs[len(errs)-1].Detail
	}
	if rp := cron.Spec.RetentionPolicy; rp != nil && *rp != cdiv1.DataImportCronRetainAll && *rp != cdiv1.DataImportCronRetainNone {
		errs = append(errs, field.NotSupported(spec.Child("retentionPolicy"), *rp,
			[]string{string(cdiv1.DataImportCronRetainAll), string(cdiv1.DataImportCronRetainNone)}))
		errs[len(errs)-1].Detail = msgCronRetention + ": " + errs[len(errs)-1].Detail
	}
	if ds := cron.Spec.ManagedDataSource; ds == "" {
		errs = append(errs, field.Required(spec.Child("managedDataSource"), msgCronManagedDS+": name the DataSource, in the cron's namespace, that points at the newest import"))
	} else {
		errs = append(errs, validateDNS1035(ds, spec.Child("managedDataSource"))...)
	}
	return errs
}

// validateDNS1035 checks a name that must be a DNS-1035 label: too long with
// CDI's message, otherwise the label rules.
func validateDNS1035(name string, p *field.Path) field.ErrorList {
	if len(name) > validation.DNS1035LabelMaxLength {
		return field.ErrorList{field.Invalid(p, name, fmt.Sprintf("Name cannot be longer than %d characters", validation.DNS1035LabelMaxLength))}
	}
	var errs field.ErrorList
	for _, m := range validation.IsDNS1035Label(name) {
		errs = append(errs, field.Invalid(p, name, m))
	}
	return errs
}

// ValidateDataImportCronUpdate refuses any change of the spec, as CDI does
// (SSP deletes and re-creates a cron to change it); metadata and status
// may change.
func ValidateDataImportCronUpdate(cron, old *cdiv1.DataImportCron) field.ErrorList {
	if apiequality.Semantic.DeepEqual(cron.Spec, old.Spec) {
		return nil
	}
	return field.ErrorList{field.Forbidden(field.NewPath("spec"), msgCronSpecImmutable+": delete the DataImportCron and create it again to change it")}
}

// DataImportCronValidator is the dataimportcron-validate webhook. Besides
// CDI's rules it authorises a new cron's clone source for the cron's
// ServiceAccount (spec.serviceAccountName, default "default"), the identity
// the controller later creates its imports for: a cron in A naming a claim
// of B is refused unless that ServiceAccount may clone it.
type DataImportCronValidator struct {
	// Client runs the SubjectAccessReviews.
	Client client.Client
}

// Admit implements AdmitFunc.
func (v *DataImportCronValidator) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Kind.Group != cdiv1.GroupName || req.Kind.Kind != "DataImportCron" {
		return badRequest(fmt.Sprintf("this webhook validates DataImportCrons, not %s", req.Kind.String()))
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return allowed()
	}
	var cron cdiv1.DataImportCron
	if err := json.Unmarshal(req.Object.Raw, &cron); err != nil {
		return badRequest("cannot decode the DataImportCron: " + err.Error())
	}
	name := cron.Name
	if name == "" {
		name = req.Name
	}
	if req.Operation == admissionv1.Update {
		var old cdiv1.DataImportCron
		if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
			return badRequest("cannot decode the old DataImportCron: " + err.Error())
		}
		if errs := ValidateDataImportCronUpdate(&cron, &old); len(errs) > 0 {
			return denied("DataImportCron", name, errs)
		}
		return allowed()
	}
	if errs := ValidateDataImportCron(&cron); len(errs) > 0 {
		return denied("DataImportCron", name, errs)
	}
	// The spec is immutable from here on, so this is the one admission check
	// of its source; the controller checks again before each import.
	if cron.Namespace == "" {
		cron.Namespace = req.Namespace
	}
	cron.Name = name
	ok, reason, err := cloneauth.Authorizer{Client: v.Client}.AuthorizeCron(ctx, &cron)
	if err != nil {
		return internalError(fmt.Errorf("authorising the source of DataImportCron %s/%s: %w", cron.Namespace, name, err))
	}
	if !ok {
		return forbidden(reason)
	}
	return allowed()
}
