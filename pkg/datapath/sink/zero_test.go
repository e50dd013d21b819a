package sink

import "testing"

func TestNextRun(t *testing.T) {
	// p starts 100 bytes before a block boundary: [0,100) zeros is the cut
	// first block, then two data blocks, then a zero block, a data block
	// and a short zero tail.
	p := make([]byte, 100+4*BlockSize+10)
	p[100+5] = 1
	p[100+BlockSize+7] = 1
	p[100+3*BlockSize+1] = 1
	off := int64(BlockSize - 100)
	type run struct {
		end  int
		zero bool
	}
	var got []run
	for i := 0; i < len(p); {
		j, zero := NextRun(p, off, i)
		got = append(got, run{j, zero})
		i = j
	}
	want := []run{{100, true}, {100 + 2*BlockSize, false}, {100 + 3*BlockSize, true}, {100 + 4*BlockSize, false}, {len(p), true}}
	if len(got) != len(want) {
		t.Fatalf("runs %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("runs %v, want %v", got, want)
		}
	}
	if !IsZero(make([]byte, 3<<20)) || IsZero(append(make([]byte, 2<<20), 1)) {
		t.Fatal("IsZero")
	}
}
