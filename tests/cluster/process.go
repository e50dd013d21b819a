package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// procRecord identifies a process the harness started. The start time (in
// clock ticks since boot, field 22 of /proc/<pid>/stat) guards against killing
// an unrelated process that reused the pid after ours exited.
type procRecord struct {
	Name      string `json:"name"`
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
	LogFile   string `json:"logFile"`
}

// startProcess starts a component with its output in <dir>/logs/<name>.log.
// Every component leads its own process group so that teardown also reaches
// anything it forked. With detach the process outlives the caller (dev up);
// otherwise the kernel kills it if the caller dies.
func startProcess(dir, name string, detach bool, env []string, bin string, args ...string) (procRecord, error) {
	logDir := filepath.Join(dir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return procRecord{}, fmt.Errorf("create log dir: %w", err)
	}
	logFile := filepath.Join(logDir, name+".log")
	out, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return procRecord{}, fmt.Errorf("open log for %s: %w", name, err)
	}
	defer out.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if !detach {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := cmd.Start(); err != nil {
		return procRecord{}, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	rec := procRecord{Name: name, PID: cmd.Process.Pid, LogFile: logFile}
	rec.StartTime, _ = processStartTime(rec.PID)
	// Reap the child when it exits so that it does not linger as a zombie
	// (a zombie still "exists" for kill(pid, 0)).
	go func() {
		err := cmd.Wait()
		// Say how it ended, for the error messages that quote the log.
		if f, ferr := os.OpenFile(logFile, os.O_WRONLY|os.O_APPEND, 0); ferr == nil {
			fmt.Fprintf(f, "[harness] %s exited: %v\n", name, describeExit(err))
			f.Close()
		}
	}()
	return rec, nil
}

// processStartTime reads field 22 (starttime) of /proc/<pid>/stat.
func processStartTime(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// alive reports whether the recorded process still runs (and is not a zombie).
func (p procRecord) alive() bool {
	st, err := processStartTime(p.PID)
	if err != nil {
		return false
	}
	if p.StartTime != 0 && st != p.StartTime {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
	if err != nil {
		return false
	}
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 && s[i+2] == 'Z' {
		return false
	}
	return true
}

// stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs it.
func (p procRecord) stop(grace time.Duration) error {
	if !p.alive() {
		return nil
	}
	_ = syscall.Kill(-p.PID, syscall.SIGTERM)
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !p.alive() {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(-p.PID, syscall.SIGKILL)
	_ = syscall.Kill(p.PID, syscall.SIGKILL)
	deadline = time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if !p.alive() {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("process %s (pid %d) did not exit after SIGKILL", p.Name, p.PID)
}

// logTail returns the last n lines of a component's log, for error messages.
func logTail(file string, n int) string {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func describeExit(err error) string {
	if err == nil {
		return "status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "killed by " + ws.Signal().String()
		}
	}
	return err.Error()
}

// waitReady calls ready every interval, for at most timeout, until it says
// done. It gives up at once, with the end of the log, if rec's process
// exits; on timeout the error is notReady, ready's last status and the end
// of rec's log.
func waitReady(ctx context.Context, rec procRecord, timeout, interval time.Duration, notReady string, ready func(context.Context) (done bool, status string)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		done, status := ready(ctx)
		if done {
			return nil
		}
		if status != "" {
			last = status
		}
		if !rec.alive() {
			return fmt.Errorf("%s exited:\n%s", rec.Name, logTail(rec.LogFile, 30))
		}
		select {
		case <-ctx.Done():
			if last != "" {
				notReady += " (" + last + ")"
			}
			return fmt.Errorf("%s:\n%s", notReady, logTail(rec.LogFile, 30))
		case <-time.After(interval):
		}
	}
}
