// Command nvidia-cuda-mps-control is the stand-in for NVIDIA's MPS control program on a node
// without a GPU, for containers without a shell (gpu-share's reservation image is distroless).
// It behaves as the shell stand-in tests/fixtures/mps/nvidia-cuda-mps-control does, which
// gpu-share's tests/mps.rs expects:
//
//	nvidia-cuda-mps-control -d      starts a "daemon" for $CUDA_MPS_PIPE_DIRECTORY
//	echo COMMAND | nvidia-cuda-mps-control
//
// Every start and every command is appended to the log file, $MPS_STANDIN_LOG, or when that is
// unset $GPU_SHARE_STANDIN_NVML_LOG/mps-control.log (the stand-in NVML's log directory, which
// the stand-in CDI specs mount into containers with the GPUs):
//
//	start visible=<CUDA_VISIBLE_DEVICES> pipe=<pipe dir> log=<CUDA_MPS_LOG_DIRECTORY>
//	start refused (visible=<CUDA_VISIBLE_DEVICES>)   (-d while <log>.refuse-start exists)
//	<command>                                        (a daemon runs)
//	<command> (no daemon)                            (none runs)
//
// The daemon is this program run again with a hidden argument, in its own session, waiting for
// SIGTERM (or SIGKILL); its pid is in <pipe dir>/standin-daemon.pid. Starting, it also makes the
// FIFO <pipe dir>/control, where the real daemon listens; `quit` removes it.
//
// Commands, with a daemon running (each is logged, and exits 0):
//
//	set_default_active_thread_percentage P   remembered (the last word) in <pipe dir>/standin-threads
//	get_default_active_thread_percentage     prints what was set, or 100.0
//	set_default_device_pinned_mem_limit D V  remembered per device in <pipe dir>/standin-pinned-mem
//	get_default_device_pinned_mem_limit D    prints what was set for D (nothing when unset)
//	get_server_list                          prints nothing: the stand-in runs no MPS server
//	quit                                     stops the daemon (SIGTERM), removes its pid file and FIFO
//	anything else                            accepted, and only logged
//
// Without a daemon, any command prints "Cannot find MPS control daemon process" and exits 1, as
// NVIDIA's does.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// daemonArg makes this program the daemon (the first argument; not for people to use).
	daemonArg = "--standin-mps-daemon"

	pidFile     = "standin-daemon.pid"
	threadsFile = "standin-threads"
	pinnedFile  = "standin-pinned-mem"
	controlFIFO = "control"

	// logName is the log file in $GPU_SHARE_STANDIN_NVML_LOG when $MPS_STANDIN_LOG is unset.
	logName = "mps-control.log"
	// nvmlLogEnv names the stand-in NVML's log directory (plugin.NVMLLogEnv).
	nvmlLogEnv = "GPU_SHARE_STANDIN_NVML_LOG"

	// noDaemon is what NVIDIA's control program prints when no daemon listens on the pipe.
	noDaemon = "Cannot find MPS control daemon process"
	// alreadyRunning is what NVIDIA's prints when a daemon cannot start.
	alreadyRunning = "An instance of this daemon is already running"

	// defaultThreads is the answer to get_default_active_thread_percentage before any set.
	defaultThreads = "100.0"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == daemonArg {
		daemon()
		return
	}
	os.Exit(control(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// daemon waits for SIGTERM, then dies of it, as the shell stand-in's background `sleep` does.
// SIGINT and SIGQUIT are ignored, as a shell's background job ignores them.
func daemon() {
	signal.Ignore(syscall.SIGINT, syscall.SIGQUIT)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	<-term
	signal.Reset(syscall.SIGTERM)
	_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
	// The signal is delivered to some thread soon; exit as a shell would report it if not.
	time.Sleep(5 * time.Second)
	os.Exit(128 + int(syscall.SIGTERM))
}

// control runs one invocation: the exit status.
func control(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	logPath, err := logFile()
	if err != nil {
		fmt.Fprintf(stderr, "nvidia-cuda-mps-control (stand-in): %v\n", err)
		return 2
	}
	pipe := os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
	if pipe == "" {
		fmt.Fprintln(stderr, "nvidia-cuda-mps-control (stand-in): CUDA_MPS_PIPE_DIRECTORY is not set: it names the daemon's pipe directory")
		return 2
	}
	if len(args) > 0 && args[0] == "-d" {
		return start(logPath, pipe, stderr)
	}
	return command(readLine(stdin), logPath, pipe, stdout, stderr)
}

// logFile is $MPS_STANDIN_LOG, else mps-control.log in $GPU_SHARE_STANDIN_NVML_LOG.
func logFile() (string, error) {
	if p := os.Getenv("MPS_STANDIN_LOG"); p != "" {
		return p, nil
	}
	if d := os.Getenv(nvmlLogEnv); d != "" {
		return filepath.Join(d, logName), nil
	}
	return "", fmt.Errorf("no log file: set MPS_STANDIN_LOG to one, or %s to the stand-in NVML's log directory (then %s there)", nvmlLogEnv, logName)
}

// start is `-d`: a daemon for the pipe directory, unless <log>.refuse-start exists. A daemon
// already running is left running and the new one's pid replaces its pid in the pid file, as
// the shell stand-in does.
func start(logPath, pipe string, stderr io.Writer) int {
	visible := os.Getenv("CUDA_VISIBLE_DEVICES")
	if _, err := os.Lstat(logPath + ".refuse-start"); err == nil {
		if err := appendLog(logPath, fmt.Sprintf("start refused (visible=%s)", visible)); err != nil {
			fmt.Fprintf(stderr, "nvidia-cuda-mps-control (stand-in): %v\n", err)
		}
		fmt.Fprintln(stderr, alreadyRunning)
		return 1
	}
	pid, err := spawnDaemon()
	if err != nil {
		fmt.Fprintf(stderr, "nvidia-cuda-mps-control (stand-in): cannot start the daemon: %v\n", err)
		return 1
	}
	fail := func(err error) int {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		fmt.Fprintf(stderr, "nvidia-cuda-mps-control (stand-in): %v\n", err)
		return 1
	}
	if err := os.WriteFile(filepath.Join(pipe, pidFile), []byte(strconv.Itoa(pid)+"\n"), 0o666); err != nil {
		return fail(fmt.Errorf("the daemon's pid file: %w", err))
	}
	fifo := filepath.Join(pipe, controlFIFO)
	if _, err := os.Lstat(fifo); errors.Is(err, os.ErrNotExist) {
		if err := unix.Mkfifo(fifo, 0o666); err != nil && !errors.Is(err, os.ErrExist) {
			return fail(fmt.Errorf("the daemon's control pipe %s: %w", fifo, err))
		}
	}
	line := fmt.Sprintf("start visible=%s pipe=%s log=%s", visible, pipe, os.Getenv("CUDA_MPS_LOG_DIRECTORY"))
	if err := appendLog(logPath, line); err != nil {
		return fail(err)
	}
	return 0
}

// spawnDaemon starts this program again as the daemon, in a session of its own, its standard
// streams on /dev/null (so that a caller reading `-d`'s output is not held), and leaves it.
func spawnDaemon() (int, error) {
	cmd := exec.Command("/proc/self/exe", daemonArg)
	cmd.Args[0] = os.Args[0]
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	pid := cmd.Process.Pid
	return pid, cmd.Process.Release()
}

// readLine is the first line of stdin, as the shell's `read -r` gives it: without the newline
// and without leading and trailing blanks (empty when stdin is).
func readLine(stdin io.Reader) string {
	line, _ := bufio.NewReader(stdin).ReadString('\n')
	return strings.Trim(line, " \t\n")
}

// command runs one command line against the pipe directory's daemon.
func command(line, logPath, pipe string, stdout, stderr io.Writer) int {
	pid, ok := alive(pipe)
	if !ok {
		if err := appendLog(logPath, line+" (no daemon)"); err != nil {
			fmt.Fprintf(stderr, "nvidia-cuda-mps-control (stand-in): %v\n", err)
		}
		fmt.Fprintln(stdout, noDaemon)
		return 1
	}
	if err := appendLog(logPath, line); err != nil {
		fmt.Fprintf(stderr, "nvidia-cuda-mps-control (stand-in): %v\n", err)
	}
	words := strings.Fields(line)
	verb := ""
	if len(words) > 0 {
		verb = words[0]
	}
	var err error
	switch {
	case strings.HasPrefix(line, "set_default_active_thread_percentage"):
		// The last space-separated word, as the shell's ${line##* }.
		value := line[strings.LastIndex(line, " ")+1:]
		err = os.WriteFile(filepath.Join(pipe, threadsFile), []byte(value+"\n"), 0o666)
	case line == "get_default_active_thread_percentage":
		if b, rerr := os.ReadFile(filepath.Join(pipe, threadsFile)); rerr == nil {
			_, err = stdout.Write(b)
		} else {
			fmt.Fprintln(stdout, defaultThreads)
		}
	case verb == "set_default_device_pinned_mem_limit" && len(words) == 3:
		err = setPinned(pipe, words[1], words[2])
	case verb == "get_default_device_pinned_mem_limit" && len(words) == 2:
		if v := pinned(pipe)[words[1]]; v != "" {
			fmt.Fprintln(stdout, v)
		}
	case line == "quit":
		if kerr := syscall.Kill(pid, syscall.SIGTERM); kerr != nil {
			fmt.Fprintf(stderr, "kill: %d: %v\n", pid, kerr)
		}
		_ = os.Remove(filepath.Join(pipe, pidFile))
		_ = os.Remove(filepath.Join(pipe, controlFIFO))
	}
	if err != nil {
		// The shell stand-in goes on (and exits 0) when a redirection fails; so does this.
		fmt.Fprintf(stderr, "nvidia-cuda-mps-control (stand-in): %v\n", err)
	}
	return 0
}

// alive is the daemon's pid when the pid file names a live process. A process that has exited
// but is not yet reaped (a zombie: in a container its new parent may be a PID 1 that never
// waits) counts as gone.
func alive(pipe string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(pipe, pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimRight(string(b), "\n"))
	if err != nil || pid <= 0 {
		return 0, false
	}
	if syscall.Kill(pid, 0) != nil {
		return 0, false
	}
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// pid (comm) state ...: comm may hold spaces and parentheses, the state follows the
		// last ')'.
		if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
			if s := stat[i+2]; s == 'Z' || s == 'X' {
				return 0, false
			}
		}
	}
	return pid, true
}

// pinned is device -> limit, as set_default_device_pinned_mem_limit last set them.
func pinned(pipe string) map[string]string {
	out := map[string]string{}
	b, err := os.ReadFile(filepath.Join(pipe, pinnedFile))
	if err != nil {
		return out
	}
	for _, l := range strings.Split(string(b), "\n") {
		if dev, v, ok := strings.Cut(l, " "); ok {
			out[dev] = v
		}
	}
	return out
}

func setPinned(pipe, dev, value string) error {
	f, err := os.OpenFile(filepath.Join(pipe, pinnedFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o666)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(f, "%s %s\n", dev, value); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// appendLog appends one line to the log file.
func appendLog(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o666)
	if err != nil {
		return fmt.Errorf("the log %s: %w", path, err)
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("the log %s: %w", path, err)
	}
	return f.Close()
}
