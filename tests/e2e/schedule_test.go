package e2e

import (
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// go test starts waiting parallel tests in no order it promises, so a run
// could end with its longest test started last and running alone.
// hack/test.sh passes a high -parallel, and this scheduler decides instead
// which waiting test runs next: the longest first (longestFirst, measured),
// then in the order they asked. KUBEFILL_E2E_PARALLEL tests run at once
// (default 6).
var slots = newScheduler(e2eParallel(), 2*time.Second)

// longestFirst are the parallel tests and subtests that took longest in a
// full run (at -parallel 6, in seconds: 126, 243, 141, 96, 81, 80, 78, 72,
// 69, 61, 51), started before the others so that the others fill around them.
var longestFirst = []string{
	"TestCloneDataVolumes/parallel/TwentyAtOnce/copy",
	"TestCloneDataVolumes/parallel/TwentyAtOnce/snapshot",
	"TestCloneFaults",
	"TestGoldenImageCron",
	"TestDeleteSourceNamespaceMidClone",
	"TestDeleteTargetClaimMidImport",
	"TestImporterPodDeletedMidImport",
	"TestCloneDataVolumes/parallel/csi-clone/Filesystem",
	"TestCloneDataVolumes/parallel/DeleteMidClone/snapshot",
	"TestProgressRisesMonotonically",
	"TestRestrictedNamespace",
}

func e2eParallel() int {
	if n, err := strconv.Atoi(os.Getenv("KUBEFILL_E2E_PARALLEL")); err == nil && n > 0 {
		return n
	}
	return 6
}

// scheduler admits at most size tests at once, the waiting one of lowest
// rank first (longestFirst's index, then everything else), in the order
// they asked among equals. Its first admission waits gather for the tests
// released together to ask, so that the order holds from the start.
type scheduler struct {
	mu      sync.Mutex
	cond    *sync.Cond
	free    int
	gather  time.Duration
	opened  bool
	seq     int
	waiting map[string]waiter
}

type waiter struct{ rank, seq int }

func newScheduler(size int, gather time.Duration) *scheduler {
	s := &scheduler{free: size, gather: gather, waiting: map[string]waiter{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func rank(name string) int {
	for i, n := range longestFirst {
		if n == name {
			return i
		}
	}
	return len(longestFirst)
}

// acquire waits for a slot for test name and returns the function that
// gives it back.
func (s *scheduler) acquire(name string) (release func()) {
	s.mu.Lock()
	if !s.opened {
		s.opened = true
		time.AfterFunc(s.gather, func() {
			s.mu.Lock()
			s.gather = 0
			s.mu.Unlock()
			s.cond.Broadcast()
		})
	}
	s.seq++
	s.waiting[name] = waiter{rank: rank(name), seq: s.seq}
	for s.gather > 0 || s.free == 0 || s.next() != name {
		s.cond.Wait()
	}
	delete(s.waiting, name)
	s.free--
	s.mu.Unlock()
	// The next in line may go too if a slot is left.
	s.cond.Broadcast()
	return func() {
		s.mu.Lock()
		s.free++
		s.mu.Unlock()
		s.cond.Broadcast()
	}
}

// next is the waiting test to admit first.
func (s *scheduler) next() string {
	best, bestW := "", waiter{}
	for name, w := range s.waiting {
		if best == "" || w.rank < bestW.rank || w.rank == bestW.rank && w.seq < bestW.seq {
			best, bestW = name, w
		}
	}
	return best
}

// parallelSub is a parallel subtest's first call: t.Parallel(), then a
// slot of the scheduler until the subtest ends.
func parallelSub(t *testing.T) {
	t.Parallel()
	t.Cleanup(slots.acquire(t.Name()))
}

func TestSchedulerLongestFirst(t *testing.T) {
	parallel(t)
	s := newScheduler(1, 50*time.Millisecond)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	names := []string{"TestA", "TestB", longestFirst[1], "TestC", longestFirst[0]}
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Asked in this order, all within the gathering time.
			time.Sleep(time.Duration(i) * time.Millisecond)
			release := s.acquire(name)
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			release()
		}()
	}
	wg.Wait()
	want := []string{longestFirst[0], longestFirst[1], "TestA", "TestB", "TestC"}
	if len(order) != len(want) {
		t.Fatalf("admitted %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("admitted %v, want %v", order, want)
		}
	}
}
