package gotest

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpu-share/gpu-share/tests/node/standin/plugin"
)

const (
	u0 = "GPU-0a1b2c3d-0000-4000-8000-000000000000"
	u1 = "GPU-0a1b2c3d-0000-4000-8000-000000000001"
	u2 = "GPU-0a1b2c3d-0000-4000-8000-000000000002"
)

// build builds the library and nvml_check with build.sh into a temporary directory.
func build(t *testing.T) (lib, check string) {
	t.Helper()
	out := t.TempDir()
	cmd := exec.Command("bash", "../build.sh", out, "535.104.05")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build.sh: %v\n%s", err, b)
	}
	lib = filepath.Join(out, "libnvidia-ml.so.1")
	if target, err := os.Readlink(lib); err != nil || target != "libnvidia-ml.so.535.104.05" {
		t.Fatalf("libnvidia-ml.so.1 -> %q (%v)", target, err)
	}
	return lib, filepath.Join(out, "nvml_check")
}

// devDir makes a device directory holding the named nodes (plain files: the library only
// looks for them).
func devDir(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		p := filepath.Join(dir, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func run(t *testing.T, check, lib string, env []string, calls ...string) []string {
	t.Helper()
	cmd := exec.Command(check, append([]string{lib}, calls...)...)
	cmd.Env = env
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nvml_check %v: %v\n%s", calls, err, b)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func want(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestNVML(t *testing.T) {
	lib, check := build(t)
	logDir := t.TempDir()
	dev := devDir(t, "nvidiactl", "nvidia0", "nvidia2")
	env := []string{
		"GPU_SHARE_STANDIN_DEV_DIR=" + dev,
		"GPU_SHARE_STANDIN_NVML_LOG=" + logDir,
		// GPU 1's node is not in the container: NVML does not see it.
		"GPU_SHARE_STANDIN_GPU_0=" + u0, "GPU_SHARE_STANDIN_GPU_1=" + u1, "GPU_SHARE_STANDIN_GPU_2=" + u2,
	}

	t.Run("every symbol nvml-wrapper calls resolves", func(t *testing.T) {
		want(t, run(t, check, lib, env, "syms"), "syms 0")
	})
	t.Run("calls before init are NVML_ERROR_UNINITIALIZED", func(t *testing.T) {
		want(t, run(t, check, lib, env, "count", "index:0", "byuuid:"+u0, "shutdown"),
			"count 1 12345", "index 1", "byuuid 1", "shutdown 1")
	})
	t.Run("devices by index", func(t *testing.T) {
		want(t, run(t, check, lib, env, "init_v2", "count", "index:0", "uuid", "minor", "idx", "name", "index:1", "uuid", "minor", "idx", "index:2", "shutdown"),
			"init_v2 0", "count 0 2",
			"index 0", "uuid 0 "+u0, "minor 0 0", "idx 0 0", "name 0 NVIDIA Stand-in GPU",
			"index 0", "uuid 0 "+u2, "minor 0 2", "idx 0 1",
			"index 2", "shutdown 0")
	})
	t.Run("devices by UUID", func(t *testing.T) {
		want(t, run(t, check, lib, env, "initflags", "byuuid:"+u2, "minor", "byuuid:"+u1, "byuuid:GPU-nope", "shutdown"),
			"initflags 0", "byuuid 0", "minor 0 2", "byuuid 6", "byuuid 6", "shutdown 0")
	})
	t.Run("argument errors", func(t *testing.T) {
		want(t, run(t, check, lib, env, "init", "count_null", "index:0", "uuid:10", "uuid:41", "setmode:4", "badhandle", "uuid", "minor", "shutdown"),
			"init 0", "count_null 2", "index 0", "uuid 7 -", "uuid 0 "+u0, "setmode 2", "badhandle", "uuid 2 -", "minor 2 12345", "shutdown 0")
	})
	t.Run("init nests and shutdown balances it", func(t *testing.T) {
		want(t, run(t, check, lib, env, "init_v2", "init_v2", "shutdown", "count", "shutdown", "count", "shutdown"),
			"init_v2 0", "init_v2 0", "shutdown 0", "count 0 2", "shutdown 0", "count 1 12345", "shutdown 1")
	})
	t.Run("compute mode is recorded and read back by a later process", func(t *testing.T) {
		want(t, run(t, check, lib, env, "init_v2", "byuuid:"+u2, "getmode", "setmode:3", "getmode", "index:0", "setmode:2", "shutdown"),
			"init_v2 0", "byuuid 0", "getmode 0 0", "setmode 0", "getmode 0 3", "index 0", "setmode 0", "shutdown 0")
		b, err := os.ReadFile(filepath.Join(logDir, "compute-mode.log"))
		if err != nil {
			t.Fatal(err)
		}
		want(t, strings.Split(strings.TrimSpace(string(b)), "\n"), u2+" EXCLUSIVE_PROCESS", u0+" PROHIBITED")
		want(t, run(t, check, lib, env, "init_v2", "byuuid:"+u2, "getmode", "setmode:0", "getmode", "shutdown"),
			"init_v2 0", "byuuid 0", "getmode 0 3", "setmode 0", "getmode 0 0", "shutdown 0")
	})
	t.Run("without nvidiactl the driver is not loaded", func(t *testing.T) {
		env := []string{"GPU_SHARE_STANDIN_DEV_DIR=" + devDir(t, "nvidia0"), "GPU_SHARE_STANDIN_GPU_0=" + u0}
		want(t, run(t, check, lib, env, "init_v2", "count", "driver", "errstr:9"),
			"init_v2 9", "count 1 12345", "driver 0 535.104.05", "errstr Driver Not Loaded")
	})
	t.Run("an injected failure fails every init with its code", func(t *testing.T) {
		fail := append([]string{"GPU_SHARE_STANDIN_NVML_FAIL=15"}, env...)
		want(t, run(t, check, lib, fail, "init_v2", "initflags", "count", "errstr:15"),
			"init_v2 15", "initflags 15", "count 1 12345", "errstr GPU is lost")
		bad := append([]string{"GPU_SHARE_STANDIN_NVML_FAIL=lost"}, env...)
		want(t, run(t, check, lib, bad, "init_v2"), "init_v2 999")
	})
	t.Run("no markers: no GPUs", func(t *testing.T) {
		env := []string{"GPU_SHARE_STANDIN_DEV_DIR=" + dev}
		want(t, run(t, check, lib, env, "init_v2", "count", "index:0", "shutdown"), "init_v2 0", "count 0 0", "index 2", "shutdown 0")
	})
	t.Run("error strings", func(t *testing.T) {
		want(t, run(t, check, lib, env, "errstr:0", "errstr:1", "errstr:2", "errstr:6", "errstr:7", "errstr:999"),
			"errstr Success", "errstr Uninitialized", "errstr Invalid Argument", "errstr Not Found", "errstr Insufficient Size", "errstr Unknown Error")
	})
}

// TestNVMLSeesWhatTheCDISpecInjects gives nvml_check the environment and device nodes the
// device plugin's CDI spec puts in a container that was allocated GPU 1 of two: NVML sees that
// GPU alone, by the marker the spec sets.
func TestNVMLSeesWhatTheCDISpecInjects(t *testing.T) {
	lib, check := build(t)
	c, err := plugin.ParseConfig([]byte(`{"flags": {"plugin": {"deviceListStrategy": "cdi-cri"}}, "standin": {"gpus": [
		{"index": 0, "minor": 3, "uuid": "` + u0 + `"}, {"index": 1, "minor": 6, "uuid": "` + u1 + `"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := plugin.BuildCDISpec(c, plugin.FormDevicePlugin)
	if err != nil {
		t.Fatal(err)
	}
	var device *plugin.CDIDevice
	for i := range spec.Devices {
		if spec.Devices[i].Name == u1 {
			device = &spec.Devices[i]
		}
	}
	if device == nil {
		t.Fatalf("no device %s in %+v", u1, spec.Devices)
	}
	var nodes []string
	for _, n := range append(spec.ContainerEdits.DeviceNodes, device.ContainerEdits.DeviceNodes...) {
		nodes = append(nodes, strings.TrimPrefix(n.Path, "/dev/"))
	}
	env := append([]string{"GPU_SHARE_STANDIN_DEV_DIR=" + devDir(t, nodes...)}, spec.ContainerEdits.Env...)
	env = append(env, device.ContainerEdits.Env...)
	want(t, run(t, check, lib, env, "init_v2", "count", "index:0", "uuid", "minor", "shutdown"),
		"init_v2 0", "count 0 1", "index 0", "uuid 0 "+u1, "minor 0 6", "shutdown 0")
}
