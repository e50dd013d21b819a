package cluster

import "testing"

func TestUnescapeMountPath(t *testing.T) {
	for in, want := range map[string]string{
		"/plain/path":         "/plain/path",
		`/with\040space`:      "/with space",
		`/tab\011and\134back`: "/tab\tand\\back",
		`/trailing\04`:        `/trailing\04`,
	} {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", in, got, want)
		}
	}
}
