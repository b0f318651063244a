package main

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const uuid = "GPU-5b3c7e0a-6ac7-9aeb-27a6-4d200dab509e"

// binary is the stand-in, built static (CGO_ENABLED=0) by TestMain.
var binary string

// shellStandIn is the shell stand-in gpu-share's own tests use, the behaviour to copy.
const shellStandIn = "../../../../fixtures/mps/nvidia-cuda-mps-control"

// TestMain builds the program as the node gets it, and makes the test process the subreaper of
// the daemons the programs leave: they are its children once orphaned, so that a test can kill
// one and keep it unreaped (a zombie, as under a container's PID 1 that never waits), and every
// one is reaped at the end.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "standin-mps-control-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "nvidia-cuda-mps-control")
	build := exec.Command("go", "build", "-trimpath", "-o", binary, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "PR_SET_CHILD_SUBREAPER: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	for {
		if pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil); pid <= 0 || err != nil {
			break
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one pipe directory and log, and the program run against them.
type env struct {
	t       *testing.T
	command []string
	dir     string
	pipe    string
	log     string
	vars    map[string]string
	daemons []int
}

func newEnv(t *testing.T, command ...string) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, command: command, dir: dir, pipe: filepath.Join(dir, "pipe"), log: filepath.Join(dir, "mps.log")}
	if err := os.Mkdir(e.pipe, 0o755); err != nil {
		t.Fatal(err)
	}
	e.vars = map[string]string{
		"MPS_STANDIN_LOG":         e.log,
		"CUDA_MPS_PIPE_DIRECTORY": e.pipe,
		"CUDA_MPS_LOG_DIRECTORY":  filepath.Join(dir, "log"),
		"CUDA_VISIBLE_DEVICES":    uuid,
	}
	t.Cleanup(func() {
		for _, pid := range e.daemons {
			_ = unix.Kill(pid, unix.SIGKILL)
			_, _ = unix.Wait4(pid, nil, 0, nil)
		}
	})
	return e
}

type result struct {
	Stdout, Stderr string
	Code           int
}

// run runs the program with stdin (none for "-d"); its output goes to files, as a daemon
// left behind may hold what it inherited.
func (e *env) run(stdin string, args ...string) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.command[0], append(slices.Clone(e.command[1:]), args...)...)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "MPS_STANDIN_LOG", "GPU_SHARE_STANDIN_NVML_LOG", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_VISIBLE_DEVICES":
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range e.vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := os.CreateTemp(e.dir, "stdout-")
	if err != nil {
		e.t.Fatal(err)
	}
	defer out.Close()
	errs, err := os.CreateTemp(e.dir, "stderr-")
	if err != nil {
		e.t.Fatal(err)
	}
	defer errs.Close()
	cmd.Stdout, cmd.Stderr = out, errs
	err = cmd.Run()
	var exit *exec.ExitError
	r := result{}
	switch {
	case ctx.Err() != nil:
		e.t.Fatalf("%v %q: no exit within 20 s", args, stdin)
	case errors.As(err, &exit):
		r.Code = exit.ExitCode()
	case err != nil:
		e.t.Fatalf("%v %q: %v", args, stdin, err)
	}
	r.Stdout, r.Stderr = read(e.t, out.Name()), read(e.t, errs.Name())
	if len(args) > 0 && args[0] == "-d" {
		if pid, ok := e.pid(); ok && !slices.Contains(e.daemons, pid) {
			e.daemons = append(e.daemons, pid)
		}
	}
	return r
}

// send runs one command line.
func (e *env) send(line string) result {
	e.t.Helper()
	return e.run(line + "\n")
}

// pid is the daemon's pid from the pid file.
func (e *env) pid() (int, bool) {
	b, err := os.ReadFile(filepath.Join(e.pipe, "standin-daemon.pid"))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil
}

// logLines are the log's lines, the test directory written <dir>.
func (e *env) logLines() []string {
	e.t.Helper()
	return strings.Split(strings.TrimSuffix(strings.ReplaceAll(read(e.t, e.log), e.dir, "<dir>"), "\n"), "\n")
}

// pipeFiles are the names in the pipe directory, less those only this program makes.
func (e *env) pipeFiles() []string {
	e.t.Helper()
	entries, err := os.ReadDir(e.pipe)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, d := range entries {
		if d.Name() != "control" && d.Name() != "standin-pinned-mem" {
			out = append(out, d.Name())
		}
	}
	return out
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

// state is the process's state letter from /proc (0 when it is gone).
func state(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}

// running says whether pid is a process that has not exited.
func running(pid int) bool {
	s := state(pid)
	return s != 0 && s != 'Z' && s != 'X'
}

// waitExited waits until pid has exited (gone, or a zombie).
func waitExited(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for running(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("daemon %d still running", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func want(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got  %#v\n want %#v", what, got, want)
	}
}

// scenario runs the same steps against a program, with what each gave and the pipe directory
// after it.
func scenario(t *testing.T, command ...string) (steps []string, results []result, logLines []string, files [][]string) {
	e := newEnv(t, command...)
	step := func(name string, r result) {
		steps = append(steps, name)
		results = append(results, r)
		files = append(files, e.pipeFiles())
	}
	for _, line := range []string{"get_default_active_thread_percentage", "", "quit"} {
		step("no daemon: "+line, e.send(line))
	}
	step("-d", e.run("", "-d"))
	first, _ := e.pid()
	for _, line := range []string{
		"get_default_active_thread_percentage",
		"set_default_active_thread_percentage 25",
		"get_default_active_thread_percentage",
		"  set_default_active_thread_percentage   50  ",
		"get_default_active_thread_percentage",
		"set_default_device_pinned_mem_limit " + uuid + " 40960M",
		"set_default_device_pinned_mem_limit 0 40960M",
		"get_server_list",
		"not_a_command at all",
	} {
		step(line, e.send(line))
	}
	// A second start while one runs: another daemon, named by the pid file; the first runs on.
	step("-d again", e.run("", "-d"))
	second, _ := e.pid()
	if second == first || !running(first) || !running(second) {
		t.Fatalf("%v: after a second -d, daemons %d (running %v) and %d (running %v)", command, first, running(first), second, running(second))
	}
	step("get after -d again", e.send("get_default_active_thread_percentage"))
	step("quit", e.send("quit"))
	waitExited(t, second)
	if !running(first) {
		t.Fatalf("%v: quit stopped the earlier daemon too", command)
	}
	step("after quit", e.send("get_default_active_thread_percentage"))
	if err := os.WriteFile(e.log+".refuse-start", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	step("-d refused", e.run("", "-d"))
	if err := os.Remove(e.log + ".refuse-start"); err != nil {
		t.Fatal(err)
	}
	delete(e.vars, "CUDA_VISIBLE_DEVICES")
	step("-d, no CUDA_VISIBLE_DEVICES", e.run("", "-d"))
	// Killed (and reaped: the shell stand-in takes a zombie for a daemon; see
	// TestAZombieDaemonIsGone): gone.
	third, _ := e.pid()
	if err := unix.Kill(third, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Wait4(third, nil, 0, nil); err != nil {
		t.Fatalf("%v: reaping the daemon: %v", command, err)
	}
	e.daemons = slices.DeleteFunc(e.daemons, func(p int) bool { return p == third })
	step("killed", e.send("get_default_active_thread_percentage"))
	step("quit when killed", e.send("quit"))
	return steps, results, e.logLines(), files
}

// TestLikeTheShellStandIn runs one scenario against the shell stand-in and this program: the
// same output, exit status and log, and the same files in the pipe directory.
func TestLikeTheShellStandIn(t *testing.T) {
	if _, err := os.Stat(shellStandIn); err != nil {
		t.Skipf("the shell stand-in: %v", err)
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skipf("no sh: %v", err)
	}
	steps, shell, shellLog, shellFiles := scenario(t, "sh", shellStandIn)
	_, got, gotLog, gotFiles := scenario(t, binary)
	for i, name := range steps {
		want(t, "step "+name, got[i], shell[i])
		want(t, "pipe directory after "+name, gotFiles[i], shellFiles[i])
	}
	want(t, "log", gotLog, shellLog)
	// What the shell stand-in gives, so that the comparison is not of two empty things.
	want(t, "log", gotLog, []string{
		"get_default_active_thread_percentage (no daemon)",
		" (no daemon)",
		"quit (no daemon)",
		"start visible=" + uuid + " pipe=<dir>/pipe log=<dir>/log",
		"get_default_active_thread_percentage",
		"set_default_active_thread_percentage 25",
		"get_default_active_thread_percentage",
		"set_default_active_thread_percentage   50",
		"get_default_active_thread_percentage",
		"set_default_device_pinned_mem_limit " + uuid + " 40960M",
		"set_default_device_pinned_mem_limit 0 40960M",
		"get_server_list",
		"not_a_command at all",
		"start visible=" + uuid + " pipe=<dir>/pipe log=<dir>/log",
		"get_default_active_thread_percentage",
		"quit",
		"get_default_active_thread_percentage (no daemon)",
		"start refused (visible=" + uuid + ")",
		"start visible= pipe=<dir>/pipe log=<dir>/log",
		"get_default_active_thread_percentage (no daemon)",
		"quit (no daemon)",
	})
	var outputs []string
	var codes []int
	for _, r := range got {
		outputs = append(outputs, r.Stdout)
		codes = append(codes, r.Code)
	}
	noDaemon := "Cannot find MPS control daemon process\n"
	want(t, "outputs", outputs, []string{noDaemon, noDaemon, noDaemon, "", "100.0\n", "", "25\n", "", "50\n", "", "", "", "", "", "50\n", "", noDaemon, "", "", noDaemon, noDaemon})
	want(t, "exit statuses", codes, []int{1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1})
	want(t, "refusal", got[17].Stderr, "An instance of this daemon is already running\n")
}

// TestTheDaemon: -d leaves a daemon in its own session that holds none of the caller's output,
// makes the control FIFO, and answers; quit stops it and takes the pid file and FIFO away.
func TestTheDaemon(t *testing.T) {
	e := newEnv(t, binary)
	cmd := exec.Command(binary, "-d")
	cmd.Env = append(os.Environ(), "MPS_STANDIN_LOG="+e.log, "CUDA_MPS_PIPE_DIRECTORY="+e.pipe, "CUDA_VISIBLE_DEVICES="+uuid)
	done := make(chan error, 1)
	var out []byte
	go func() {
		var err error
		out, err = cmd.CombinedOutput()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("-d: %v\n%s", err, out)
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("-d with its output read: no end within 20 s (the daemon holds the output)")
	}
	pid, ok := e.pid()
	if !ok {
		t.Fatal("no pid file")
	}
	e.daemons = append(e.daemons, pid)
	if !running(pid) {
		t.Fatalf("daemon %d not running", pid)
	}
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Fatalf("daemon %d: session %d (%v), want a session of its own", pid, sid, err)
	}
	if cmdline := read(t, fmt.Sprintf("/proc/%d/cmdline", pid)); !strings.Contains(cmdline, "\x00"+daemonArg) {
		t.Fatalf("daemon %d runs %q", pid, cmdline)
	}
	fifo := filepath.Join(e.pipe, "control")
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("the control FIFO: %v %v", fi, err)
	}
	// The pinned memory limit is answered per device as set.
	e.send("set_default_device_pinned_mem_limit " + uuid + " 40960M")
	e.send("set_default_device_pinned_mem_limit 0 20G")
	e.send("set_default_device_pinned_mem_limit " + uuid + " 30000M")
	for dev, limit := range map[string]string{uuid: "30000M\n", "0": "20G\n", "1": ""} {
		if r := e.send("get_default_device_pinned_mem_limit " + dev); r != (result{Stdout: limit}) {
			t.Fatalf("the limit of %s: %+v, want %q", dev, r, limit)
		}
	}
	if r := e.send("quit"); r != (result{}) {
		t.Fatalf("quit: %+v", r)
	}
	waitExited(t, pid)
	for _, f := range []string{"standin-daemon.pid", "control"} {
		if _, err := os.Lstat(filepath.Join(e.pipe, f)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s after quit: %v", f, err)
		}
	}
	// A second -d with the FIFO there keeps it.
	if r := e.run("", "-d"); r.Code != 0 {
		t.Fatalf("-d: %+v", r)
	}
	if r := e.run("", "-d"); r.Code != 0 {
		t.Fatalf("-d again: %+v", r)
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("the control FIFO: %v %v", fi, err)
	}
}

// TestTheLog: without MPS_STANDIN_LOG the log is mps-control.log in the stand-in NVML's log
// directory; with neither, and without a pipe directory, the program fails in words.
func TestTheLog(t *testing.T) {
	e := newEnv(t, binary)
	nvmlLog := filepath.Join(e.dir, "nvml")
	if err := os.Mkdir(nvmlLog, 0o755); err != nil {
		t.Fatal(err)
	}
	delete(e.vars, "MPS_STANDIN_LOG")
	e.vars["GPU_SHARE_STANDIN_NVML_LOG"] = nvmlLog
	log := filepath.Join(nvmlLog, "mps-control.log")
	if err := os.WriteFile(log+".refuse-start", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := e.run("", "-d"); r.Code != 1 {
		t.Fatalf("-d with %s.refuse-start: %+v", log, r)
	}
	if err := os.Remove(log + ".refuse-start"); err != nil {
		t.Fatal(err)
	}
	if r := e.run("", "-d"); r.Code != 0 {
		t.Fatalf("-d: %+v", r)
	}
	if r := e.send("quit"); r.Code != 0 {
		t.Fatalf("quit: %+v", r)
	}
	want(t, "the log in the NVML log directory", strings.Split(read(t, log), "\n"), []string{
		"start refused (visible=" + uuid + ")",
		"start visible=" + uuid + " pipe=" + e.pipe + " log=" + filepath.Join(e.dir, "log"),
		"quit",
		"",
	})
	// MPS_STANDIN_LOG wins.
	e.vars["MPS_STANDIN_LOG"] = e.log
	e.send("quit")
	want(t, "MPS_STANDIN_LOG", read(t, e.log), "quit (no daemon)\n")

	delete(e.vars, "MPS_STANDIN_LOG")
	delete(e.vars, "GPU_SHARE_STANDIN_NVML_LOG")
	for _, args := range [][]string{{"-d"}, nil} {
		r := e.run("quit\n", args...)
		if r.Code != 2 || r.Stdout != "" || !strings.Contains(r.Stderr, "MPS_STANDIN_LOG") || !strings.Contains(r.Stderr, "GPU_SHARE_STANDIN_NVML_LOG") {
			t.Fatalf("%v without a log: %+v", args, r)
		}
	}
	e.vars["MPS_STANDIN_LOG"] = e.log
	delete(e.vars, "CUDA_MPS_PIPE_DIRECTORY")
	if r := e.run("", "-d"); r.Code != 2 || !strings.Contains(r.Stderr, "CUDA_MPS_PIPE_DIRECTORY") {
		t.Fatalf("-d without a pipe directory: %+v", r)
	}
	want(t, "nothing logged when failing", read(t, e.log), "quit (no daemon)\n")
	if entries, _ := os.ReadDir(e.pipe); len(entries) != 0 {
		t.Fatalf("pipe directory: %v", entries)
	}
}

// TestAZombieDaemonIsGone: a daemon killed but not yet reaped (this process is its subreaper
// and does not wait) is no daemon, as it would be under a PID 1 that never reaps.
func TestAZombieDaemonIsGone(t *testing.T) {
	e := newEnv(t, binary)
	if r := e.run("", "-d"); r.Code != 0 {
		t.Fatalf("-d: %+v", r)
	}
	pid, _ := e.pid()
	if r := e.send("get_default_active_thread_percentage"); r.Stdout != "100.0\n" {
		t.Fatalf("get: %+v", r)
	}
	if err := unix.Kill(pid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExited(t, pid)
	if s := state(pid); s != 'Z' {
		t.Fatalf("daemon %d: state %q, want a zombie (is this process its subreaper?)", pid, s)
	}
	if r := e.send("get_default_active_thread_percentage"); r != (result{Stdout: "Cannot find MPS control daemon process\n", Code: 1}) {
		t.Fatalf("a zombie daemon: %+v", r)
	}
	// It died of the signal, as the shell stand-in's sleep does.
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
	e.daemons = slices.DeleteFunc(e.daemons, func(p int) bool { return p == pid })
	if !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("daemon %d ended %v", pid, ws)
	}
}

// TestStatic: the program runs in a container with no C library of its own (gpu-share's
// distroless image).
func TestStatic(t *testing.T) {
	f, err := elf.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the program asks for a dynamic loader")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) != 0 {
		t.Fatalf("libraries %v (%v)", libs, err)
	}
}
