package source

import "strings"

// kubevirtEnvMarker is what marks an image environment variable as a label
// for the claim, as CDI reads containerdisks: INSTANCETYPE_KUBEVIRT_IO_X_Y
// becomes instancetype.kubevirt.io/x-y, KUBEVIRT_IO_X kubevirt.io/x.
const kubevirtEnvMarker = "KUBEVIRT_IO_"

// ImageEnvLabels turns an image's environment ("NAME=value") into the
// labels CDI gives the claim a containerdisk is imported into; variables
// without the marker are not labels. The caller checks the result is a
// valid label before using it: the image is not trusted.
func ImageEnvLabels(env []string) map[string]string {
	labels := map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.Contains(k, kubevirtEnvMarker) {
			continue
		}
		labels[envLabelKey(k)] = v
	}
	return labels
}

// envLabelKey is CDI's conversion: the words before the marker become the
// domain's prefix, joined by dots; the words after it the name, joined by
// dashes; all lower case.
func envLabelKey(env string) string {
	before, after, _ := strings.Cut(env, kubevirtEnvMarker)
	key := ""
	if words := strings.Split(strings.TrimSuffix(before, "_"), "_"); words[0] != "" {
		key = strings.Join(words, ".") + "."
	}
	key += "kubevirt.io/" + strings.Join(strings.Split(after, "_"), "-")
	return strings.ToLower(key)
}
