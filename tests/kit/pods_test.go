package kit

import "testing"

func TestTestNamespaceName(t *testing.T) {
	for _, tc := range []struct{ test, want string }{
		{"TestImport", "testimport-"},
		{"TestImporterImportsUnder64MiLimit/disk.qcow2", "testimporterimportsunder64milimit-disk-q-"},
		{"TestCloneDataVolumes/parallel/snapshot/Block", "testclonedatavolumes-parallel-snapshot-b-"},
		{"TestA_b c", "testa-b-c-"},
		{"TestX/", "testx-"},
	} {
		if got := TestNamespaceName(tc.test); got != tc.want {
			t.Errorf("TestNamespaceName(%q) = %q, want %q", tc.test, got, tc.want)
		}
	}
}
