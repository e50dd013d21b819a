package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

const stream = `{"Action":"start","Package":"example.com/m/tests/e2e"}
{"Action":"run","Package":"example.com/m/tests/e2e","Test":"TestSlow"}
{"Action":"output","Package":"example.com/m/tests/e2e","Test":"TestSlow","Output":"=== RUN   TestSlow\n"}
{"Action":"run","Package":"example.com/m/tests/e2e","Test":"TestSlow/sub"}
{"Action":"pass","Package":"example.com/m/tests/e2e","Test":"TestSlow/sub","Elapsed":4.5}
{"Action":"pass","Package":"example.com/m/tests/e2e","Test":"TestSlow","Elapsed":12.25}
{"Action":"fail","Package":"example.com/m/tests/e2e","Test":"TestBroken","Elapsed":1}
{"Action":"skip","Package":"example.com/m/tests/e2e","Test":"TestSkipped","Elapsed":0}
{"Action":"pass","Package":"example.com/m/tests/e2e","Test":"TestFast","Elapsed":0.1}
not json: a build error
{"Action":"fail","Package":"example.com/m/tests/e2e","Elapsed":20}
`

func TestParse(t *testing.T) {
	r, err := parse(strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Tests) != 5 || len(r.Packages) != 1 {
		t.Fatalf("%d tests and %d packages, want 5 and 1: %+v", len(r.Tests), len(r.Packages), r)
	}
	if got, want := strings.Join(r.Failed, ","), "e2e.TestBroken,example.com/m/tests/e2e"; got != want {
		t.Errorf("failed %q, want %q", got, want)
	}
	if r.Tests[1].Elapsed != 12250*time.Millisecond {
		t.Errorf("TestSlow took %s, want 12.25s", r.Tests[1].Elapsed)
	}
}

func TestSlowest(t *testing.T) {
	rs := []result{
		{Test: "TestA", Elapsed: time.Second},
		{Test: "TestB", Elapsed: 3 * time.Second},
		{Test: "TestB/x", Elapsed: 5 * time.Second},
		{Test: "TestC", Elapsed: 3 * time.Second},
		{Test: "TestD", Elapsed: 2 * time.Second},
	}
	var names []string
	for _, r := range slowest(rs, 3, result.TopLevel) {
		names = append(names, r.Test)
	}
	if got, want := strings.Join(names, ","), "TestB,TestC,TestD"; got != want {
		t.Errorf("slowest three top-level tests %s, want %s", got, want)
	}
	if got := slowest(rs, 10, nil); len(got) != 5 || got[0].Test != "TestB/x" {
		t.Errorf("slowest of all: %+v", got)
	}
}

func TestSummary(t *testing.T) {
	steps := "unit\t61.5\tok\ne2e-tests\t900\tfailed\nbroken line\n"
	open := func(name string) (io.ReadCloser, error) {
		if name == "e2e-tests" {
			return io.NopCloser(strings.NewReader(stream)), nil
		}
		return nil, os.ErrNotExist
	}
	got, err := readSteps(strings.NewReader(steps), open)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Wall != 61500*time.Millisecond || len(got[1].Runs) != 1 {
		t.Fatalf("steps %+v", got)
	}
	var b bytes.Buffer
	summarise(&b, got, 2)
	out := b.String()
	// Columns are padded; compared with runs of blanks as one.
	flat := squeeze(out)
	for _, want := range []string{
		"unit 1m2s 0 0 0 ok",
		"e2e-tests 15m0s 2 1 1 failed",
		"total 16m2s",
		"e2e-tests: the 2 slowest tests 12s pass e2e.TestSlow 1s fail e2e.TestBroken e2e-tests:",
		"e2e-tests: the 2 slowest subtests 4.5s pass e2e.TestSlow/sub",
		"e2e-tests: failed: e2e.TestBroken, example.com/m/tests/e2e",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("the summary does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "unit: the") {
		t.Errorf("a step without tests lists tests:\n%s", out)
	}
}

func squeeze(s string) string { return strings.Join(strings.Fields(s), " ") }

func TestReadStepsBadTime(t *testing.T) {
	_, err := readSteps(strings.NewReader("unit\tsoon\tok\n"), func(string) (io.ReadCloser, error) { return nil, os.ErrNotExist })
	if err == nil || !strings.Contains(err.Error(), "unit") {
		t.Errorf("a bad wall time gave %v", err)
	}
}

func TestText(t *testing.T) {
	const in = `{"Action":"output","Package":"p","Output":"starting the cluster\n"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"p","Test":"TestOK"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"    x_test.go:9: broken\n"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestBad"}
not json: a build error
{"Action":"output","Package":"q","Output":"PASS\n"}
{"Action":"output","Package":"q","Output":"ok  \tq\t0.1s\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.1s\n"}
{"Action":"fail","Package":"p"}
`
	var out, raw bytes.Buffer
	if err := text(strings.NewReader(in), &out, &raw, false); err != nil {
		t.Fatal(err)
	}
	if raw.String() != in {
		t.Errorf("the raw copy differs:\n%s", raw.String())
	}
	want := "starting the cluster\n=== RUN   TestBad\n    x_test.go:9: broken\n--- FAIL: TestBad (0.00s)\nnot json: a build error\nok  \tq\t0.1s\nFAIL\tp\t0.1s\n"
	if out.String() != want {
		t.Errorf("text:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	if err := text(strings.NewReader(in), &out, io.Discard, true); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "--- PASS: TestOK") {
		t.Errorf("verbose text leaves out a passing test:\n%s", out.String())
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestTextWriteError(t *testing.T) {
	if err := text(strings.NewReader(stream), io.Discard, failingWriter{}, false); err == nil {
		t.Error("a failing raw copy was not reported")
	}
}
