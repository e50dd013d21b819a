package token

import (
	"errors"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ErrPayloadMismatch is wrapped by the Check functions when a valid token was
// issued for something else than what the caller is about to do.
var ErrPayloadMismatch = errors.New("token payload does not match the request")

// NewUploadPayload is the payload of an upload token for the PVC namespace/name.
func NewUploadPayload(namespace, name string) *Payload {
	return &Payload{Operation: OperationUpload, Name: name, Namespace: namespace, Resource: ResourcePVC}
}

// NewClonePayload is the payload of a clone token from the source object
// (a PVC or a VolumeSnapshot, as resource says) into the target DataVolume or PVC.
func NewClonePayload(resource metav1.GroupVersionResource, sourceNamespace, sourceName, targetNamespace, targetName string) *Payload {
	return &Payload{
		Operation: OperationClone,
		Name:      sourceName,
		Namespace: sourceNamespace,
		Resource:  resource,
		Params: map[string]string{
			ParamTargetNamespace: targetNamespace,
			ParamTargetName:      targetName,
		},
	}
}

// CheckUpload returns nil when p allows an upload into the PVC namespace/name.
// Like CDI it compares the resource name only, so tokens that omit the version
// still match.
func CheckUpload(p *Payload, namespace, name string) error {
	if p == nil {
		return fmt.Errorf("%w: no payload", ErrPayloadMismatch)
	}
	var bad []string
	if p.Operation != OperationUpload {
		bad = append(bad, fmt.Sprintf("operation is %q, want %q", p.Operation, OperationUpload))
	}
	if p.Resource.Resource != ResourcePVC.Resource || p.Resource.Group != "" {
		bad = append(bad, fmt.Sprintf("resource is %q, want %q", gvrString(p.Resource), ResourcePVC.Resource))
	}
	if name == "" || p.Name != name {
		bad = append(bad, fmt.Sprintf("name is %q, want %q", p.Name, name))
	}
	if namespace == "" || p.Namespace != namespace {
		bad = append(bad, fmt.Sprintf("namespace is %q, want %q", p.Namespace, namespace))
	}
	return mismatch(bad)
}

// CheckClone returns nil when p allows cloning the source (resource,
// sourceNamespace/sourceName) into targetNamespace/targetName.
func CheckClone(p *Payload, resource metav1.GroupVersionResource, sourceNamespace, sourceName, targetNamespace, targetName string) error {
	if p == nil {
		return fmt.Errorf("%w: no payload", ErrPayloadMismatch)
	}
	var bad []string
	if p.Operation != OperationClone {
		bad = append(bad, fmt.Sprintf("operation is %q, want %q", p.Operation, OperationClone))
	}
	if p.Resource.Resource != resource.Resource || p.Resource.Group != resource.Group {
		bad = append(bad, fmt.Sprintf("resource is %q, want %q", gvrString(p.Resource), gvrString(resource)))
	}
	if sourceName == "" || p.Name != sourceName {
		bad = append(bad, fmt.Sprintf("source name is %q, want %q", p.Name, sourceName))
	}
	if sourceNamespace == "" || p.Namespace != sourceNamespace {
		bad = append(bad, fmt.Sprintf("source namespace is %q, want %q", p.Namespace, sourceNamespace))
	}
	if got := p.Params[ParamTargetNamespace]; targetNamespace == "" || got != targetNamespace {
		bad = append(bad, fmt.Sprintf("target namespace is %q, want %q", got, targetNamespace))
	}
	if got := p.Params[ParamTargetName]; targetName == "" || got != targetName {
		bad = append(bad, fmt.Sprintf("target name is %q, want %q", got, targetName))
	}
	return mismatch(bad)
}

func mismatch(bad []string) error {
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrPayloadMismatch, strings.Join(bad, "; "))
}

func gvrString(r metav1.GroupVersionResource) string {
	if r.Group == "" {
		return r.Resource
	}
	return r.Resource + "." + r.Group
}
