package nodeagent

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// objectGetter reads the ConfigMaps and Secrets a pod refers to.
type objectGetter interface {
	configMap(ns, name string) (*corev1.ConfigMap, error)
	secret(ns, name string) (*corev1.Secret, error)
}

// expandVars replaces $(NAME) with lookup's value as Kubernetes does for env
// values, command and args: "$$" is a literal "$", and a reference to an
// unknown name is left as written.
func expandVars(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// fieldValue resolves a downward-API field path of a pod.
func fieldValue(pod *corev1.Pod, fieldPath string) (string, error) {
	if k, ok := subscript(fieldPath, "metadata.labels"); ok {
		return pod.Labels[k], nil
	}
	if k, ok := subscript(fieldPath, "metadata.annotations"); ok {
		return pod.Annotations[k], nil
	}
	switch fieldPath {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.podIPs":
		var ips []string
		for _, ip := range pod.Status.PodIPs {
			ips = append(ips, ip.IP)
		}
		return strings.Join(ips, ","), nil
	}
	return "", fmt.Errorf("unsupported downward API field %q", fieldPath)
}

// subscript parses `prefix['key']`.
func subscript(path, prefix string) (string, bool) {
	if !strings.HasPrefix(path, prefix+"['") || !strings.HasSuffix(path, "']") {
		return "", false
	}
	return path[len(prefix)+2 : len(path)-2], true
}

// formatMap renders labels or annotations the way the downward API's volume
// files do: one key="value" per line, sorted.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s=%q", k, m[k])
	}
	return b.String()
}

// resourceValue resolves a resourceFieldRef against a container's resources.
func resourceValue(c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	var q corev1.ResourceList
	res := ref.Resource
	switch {
	case strings.HasPrefix(res, "limits."):
		q, res = c.Resources.Limits, strings.TrimPrefix(res, "limits.")
	case strings.HasPrefix(res, "requests."):
		q, res = c.Resources.Requests, strings.TrimPrefix(res, "requests.")
	default:
		return "", fmt.Errorf("unsupported resource field %q", ref.Resource)
	}
	v, ok := q[corev1.ResourceName(res)]
	if !ok {
		return "0", nil
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		if res == "cpu" {
			// Whole cores, rounded up, as the kubelet reports by default.
			return fmt.Sprint((v.MilliValue() + 999) / 1000), nil
		}
		return fmt.Sprint(v.Value()), nil
	}
	if res == "cpu" {
		return fmt.Sprint((v.MilliValue() + divisor.MilliValue() - 1) / divisor.MilliValue()), nil
	}
	return fmt.Sprint((v.Value() + divisor.Value() - 1) / divisor.Value()), nil
}

// containerEnv builds a container's environment: envFrom first, then env in
// order, each value expanded against what came before.
func containerEnv(pod *corev1.Pod, c *corev1.Container, get objectGetter) ([]string, error) {
	vals := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := get.configMap(pod.Namespace, from.ConfigMapRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional {
					continue
				}
				return nil, fmt.Errorf("envFrom configmap %s: %w", from.ConfigMapRef.Name, err)
			}
			for _, k := range sortedKeys(cm.Data) {
				set(from.Prefix+k, cm.Data[k])
			}
		case from.SecretRef != nil:
			s, err := get.secret(pod.Namespace, from.SecretRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && from.SecretRef.Optional != nil && *from.SecretRef.Optional {
					continue
				}
				return nil, fmt.Errorf("envFrom secret %s: %w", from.SecretRef.Name, err)
			}
			keys := make([]string, 0, len(s.Data))
			for k := range s.Data {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				set(from.Prefix+k, string(s.Data[k]))
			}
		}
	}
	lookup := func(k string) (string, bool) { v, ok := vals[k]; return v, ok }
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expandVars(e.Value, lookup))
			continue
		}
		v, skip, err := envFromSource(pod, c, e.ValueFrom, get)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if !skip {
			set(e.Name, v)
		}
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+vals[k])
	}
	return out, nil
}

func envFromSource(pod *corev1.Pod, c *corev1.Container, src *corev1.EnvVarSource, get objectGetter) (val string, skip bool, err error) {
	switch {
	case src.FieldRef != nil:
		v, err := fieldValue(pod, src.FieldRef.FieldPath)
		return v, false, err
	case src.ResourceFieldRef != nil:
		v, err := resourceValue(c, src.ResourceFieldRef)
		return v, false, err
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		optional := ref.Optional != nil && *ref.Optional
		cm, err := get.configMap(pod.Namespace, ref.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return "", true, nil
			}
			return "", false, fmt.Errorf("configmap %s: %w", ref.Name, err)
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if optional {
				return "", true, nil
			}
			return "", false, fmt.Errorf("configmap %s has no key %q", ref.Name, ref.Key)
		}
		return v, false, nil
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		optional := ref.Optional != nil && *ref.Optional
		s, err := get.secret(pod.Namespace, ref.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return "", true, nil
			}
			return "", false, fmt.Errorf("secret %s: %w", ref.Name, err)
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			if optional {
				return "", true, nil
			}
			return "", false, fmt.Errorf("secret %s has no key %q", ref.Name, ref.Key)
		}
		return string(v), false, nil
	}
	return "", false, fmt.Errorf("unsupported env source")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// commandLine is what a container runs: its command or the image's
// entrypoint, then its args or (only when it sets no command) the image's
// default args, with $(VAR) references expanded from its environment.
func commandLine(c *corev1.Container, img Image, env []string) ([]string, error) {
	vals := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vals[k] = v
	}
	lookup := func(k string) (string, bool) { v, ok := vals[k]; return v, ok }
	var argv []string
	switch {
	case len(c.Command) > 0:
		argv = append(argv, c.Command...)
		argv = append(argv, c.Args...)
	case len(c.Args) > 0:
		argv = append(argv, img.Entrypoint...)
		argv = append(argv, c.Args...)
	default:
		argv = append(argv, img.Entrypoint...)
		argv = append(argv, img.Cmd...)
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("container %s has no command and its image no entrypoint", c.Name)
	}
	for i := range argv {
		argv[i] = expandVars(argv[i], lookup)
	}
	return argv, nil
}
