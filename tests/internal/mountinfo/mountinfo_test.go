package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"/plain/path":         "/plain/path",
		`/with\040space`:      "/with space",
		`/tab\011and\134back`: "/tab\tand\\back",
		`/trailing\04`:        `/trailing\04`,
		`/ends\040`:           "/ends ",
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMountPointsHasRoot(t *testing.T) {
	mounts, err := MountPoints()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if m == "/" {
			return
		}
	}
	t.Errorf("no / among this process's mount points: %v", mounts)
}
