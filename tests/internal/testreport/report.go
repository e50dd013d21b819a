package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent).
type event struct {
	Time    time.Time `json:",omitempty"`
	Action  string
	Package string  `json:",omitempty"`
	Test    string  `json:",omitempty"`
	Elapsed float64 `json:",omitempty"`
	Output  string  `json:",omitempty"`
}

// result is one test's (or one package's, Test empty) outcome.
type result struct {
	Package, Test string
	// Action is pass, fail or skip.
	Action  string
	Elapsed time.Duration
}

// Name is the test's name qualified by the last element of its package's
// path ("e2e.TestCloneDataVolumes"), or the package path for a package.
func (r result) Name() string {
	if r.Test == "" {
		return r.Package
	}
	pkg := r.Package
	if i := strings.LastIndex(pkg, "/"); i >= 0 {
		pkg = pkg[i+1:]
	}
	return pkg + "." + r.Test
}

// TopLevel reports whether the result is a top-level test (not a subtest,
// not a package).
func (r result) TopLevel() bool { return r.Test != "" && !strings.Contains(r.Test, "/") }

// run is what one `go test -json` stream held.
type run struct {
	Tests    []result
	Packages []result
	// Failed names the tests and packages that failed, in the order they did.
	Failed []string
}

// parse reads a `go test -json` stream. Lines that are not JSON events (a
// build error printed before the events, a stray line) are ignored, and
// a test with no final event (the binary panicked or timed out) counts as
// failed by its package's failure.
func parse(r io.Reader) (run, error) {
	var out run
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var e event
		if err := json.Unmarshal(line, &e); err != nil {
			continue
		}
		switch e.Action {
		case "pass", "fail", "skip":
		default:
			continue
		}
		res := result{Package: e.Package, Test: e.Test, Action: e.Action, Elapsed: time.Duration(e.Elapsed * float64(time.Second))}
		if e.Test == "" {
			out.Packages = append(out.Packages, res)
		} else {
			out.Tests = append(out.Tests, res)
		}
		if e.Action == "fail" {
			out.Failed = append(out.Failed, res.Name())
		}
	}
	return out, sc.Err()
}

// slowest returns up to n results, longest first (ties by name), keeping
// only those keep accepts.
func slowest(results []result, n int, keep func(result) bool) []result {
	var picked []result
	for _, r := range results {
		if keep == nil || keep(r) {
			picked = append(picked, r)
		}
	}
	sort.SliceStable(picked, func(i, j int) bool {
		if picked[i].Elapsed != picked[j].Elapsed {
			return picked[i].Elapsed > picked[j].Elapsed
		}
		return picked[i].Name() < picked[j].Name()
	})
	if len(picked) > n {
		picked = picked[:n]
	}
	return picked
}

// step is one step of hack/test.sh: its wall time and the test runs in it.
type step struct {
	Name string
	Wall time.Duration
	// Status is what the step ended with ("ok", or "failed").
	Status string
	Runs   []run
}

// counts is how many top-level tests passed, failed and were skipped.
func (s step) counts() (pass, fail, skip int) {
	for _, r := range s.Runs {
		for _, t := range r.Tests {
			if !t.TopLevel() {
				continue
			}
			switch t.Action {
			case "pass":
				pass++
			case "fail":
				fail++
			case "skip":
				skip++
			}
		}
	}
	return
}

// summarise writes the report: every step's wall time and test counts,
// then, per step with tests, its ten slowest top-level tests and its ten
// slowest subtests.
func summarise(w io.Writer, steps []step, n int) {
	var total time.Duration
	fmt.Fprintf(w, "%-34s %9s %6s %5s %5s  %s\n", "step", "wall", "pass", "fail", "skip", "status")
	for _, s := range steps {
		total += s.Wall
		pass, fail, skip := s.counts()
		fmt.Fprintf(w, "%-34s %9s %6d %5d %5d  %s\n", s.Name, round(s.Wall), pass, fail, skip, s.Status)
	}
	fmt.Fprintf(w, "%-34s %9s\n", "total", round(total))
	for _, s := range steps {
		var tests []result
		for _, r := range s.Runs {
			tests = append(tests, r.Tests...)
		}
		if len(tests) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s: the %d slowest tests\n", s.Name, n)
		for _, t := range slowest(tests, n, result.TopLevel) {
			fmt.Fprintf(w, "  %9s  %-4s %s\n", round(t.Elapsed), t.Action, t.Name())
		}
		subs := slowest(tests, n, func(r result) bool { return !r.TopLevel() })
		if len(subs) > 0 {
			fmt.Fprintf(w, "%s: the %d slowest subtests\n", s.Name, n)
			for _, t := range subs {
				fmt.Fprintf(w, "  %9s  %-4s %s\n", round(t.Elapsed), t.Action, t.Name())
			}
		}
		var failed []string
		for _, r := range s.Runs {
			failed = append(failed, r.Failed...)
		}
		if len(failed) > 0 {
			fmt.Fprintf(w, "%s: failed: %s\n", s.Name, strings.Join(failed, ", "))
		}
	}
}

func round(d time.Duration) string {
	if d >= 10*time.Second {
		return d.Round(time.Second).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

// text writes a `go test -json` stream as `go test` without -v would have
// printed it, so a log stays readable: a test's output only if it failed,
// everything else (package results, TestMain's messages, build errors) as
// it comes, but for a test binary's PASS line. verbose writes every event's output as it comes. Every line is
// copied to raw; lines that are not events are written through as they are.
func text(in io.Reader, out, raw io.Writer, verbose bool) error {
	held := map[string][]string{} // package + test → output so far
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if _, err := raw.Write(append(line, '\n')); err != nil {
			return err
		}
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			if _, err := out.Write(append(line, '\n')); err != nil {
				return err
			}
			continue
		}
		var write []string
		key := e.Package + " " + e.Test
		switch {
		case verbose:
			write = []string{e.Output}
		case e.Test == "":
			// A test binary's own "PASS" line, which go test leaves out
			// of a passing package's result.
			if e.Output != "PASS\n" {
				write = []string{e.Output}
			}
		case e.Action == "output":
			held[key] = append(held[key], e.Output)
		case e.Action == "fail":
			write = held[key]
			delete(held, key)
		case e.Action == "pass" || e.Action == "skip":
			delete(held, key)
		}
		for _, s := range write {
			if _, err := io.WriteString(out, s); err != nil {
				return err
			}
		}
	}
	return sc.Err()
}
