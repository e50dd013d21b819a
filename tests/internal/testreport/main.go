// Command testreport keeps hack/test.sh's `go test -json` output and says
// where the time went: each step's wall time and its slowest tests.
//
//	go test -json ./... | testreport tee -dir DIR -step NAME [-v]
//	    prints the stream as go test's usual text (with -v: as go test -v's)
//	    and keeps it in DIR/NAME.json
//	testreport summary -dir DIR [-n 10]
//	    reads DIR/steps.tsv (lines: step, wall seconds, status, as hack/test.sh
//	    writes them) and each step's DIR/NAME.json, and prints every step's
//	    wall time and test counts, then its n slowest tests and subtests
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testreport tee -dir DIR -step NAME | testreport summary -dir DIR [-n N]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "tee":
		err = teeCmd(os.Args[2:])
	case "summary":
		err = summaryCmd(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (want tee or summary)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
}

func teeCmd(args []string) error {
	fs := flag.NewFlagSet("tee", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory the report is kept in")
	step := fs.String("step", "", "name of the step (a file name)")
	verbose := fs.Bool("v", false, "print every test's output, as go test -v does")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *step == "" || strings.ContainsRune(*step, '/') {
		return errors.New("tee needs -dir and a -step name without a slash")
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	// Appended: a step may run go test more than once.
	f, err := os.OpenFile(filepath.Join(*dir, *step+".json"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	raw := bufio.NewWriter(f)
	err = text(os.Stdin, os.Stdout, raw, *verbose)
	return errors.Join(err, raw.Flush(), f.Close())
}

func summaryCmd(args []string) error {
	fs := flag.NewFlagSet("summary", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory the report is kept in")
	n := fs.Int("n", 10, "how many of the slowest tests to list per step")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(*dir, "steps.tsv"))
	if err != nil {
		return err
	}
	defer f.Close()
	steps, err := readSteps(f, func(name string) (io.ReadCloser, error) {
		return os.Open(filepath.Join(*dir, name+".json"))
	})
	if err != nil {
		return err
	}
	summarise(os.Stdout, steps, *n)
	return nil
}

// readSteps reads steps.tsv (step, seconds, status per line) and, through
// open, each step's test stream if it has one.
func readSteps(r io.Reader, open func(string) (io.ReadCloser, error)) ([]step, error) {
	var out []step
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 3 {
			continue
		}
		secs, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return nil, fmt.Errorf("step %s: wall time %q: %w", f[0], f[1], err)
		}
		s := step{Name: f[0], Wall: time.Duration(secs * float64(time.Second)), Status: f[2]}
		if rc, err := open(f[0]); err == nil {
			run, perr := parse(rc)
			rc.Close()
			if perr != nil {
				return nil, fmt.Errorf("step %s: %w", f[0], perr)
			}
			s.Runs = append(s.Runs, run)
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		out = append(out, s)
	}
	return out, sc.Err()
}
