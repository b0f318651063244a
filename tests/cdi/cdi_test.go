// Package cdi_test loads the CDI specs a gpu-share reservation writes
// (tests/fixtures/cdi/written/, kept by tests/cdi_specs.rs) beside NVIDIA's own
// (tests/fixtures/cdi/nvidia/) into the CDI library that containerd, CRI-O and NVIDIA's
// Container Toolkit share, as a node's /var/run/cdi holds them, and checks what the library
// injects into a container's OCI spec for gpu-share.io/mps=<UUID> and gpu-share.io/gpu=<UUID>,
// and the library's own errors for a name no spec defines and a name two files define.
//
// The library fills a device node's type (and its numbers, where the spec gives none) from the
// node on the host at injection; NVIDIA's specs give no type, so every node must exist. This
// machine has no GPU: the injection tests load a copy of the specs whose device nodes' host paths
// are /dev/null (their container paths, and the numbers NVIDIA's spec gives, unchanged), and
// TestHostDeviceNodes shows what the library does with the specs as written.
package cdi_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const fixtures = "../fixtures/cdi"

// GPU 0 and GPU 1 of the node NVIDIA's fixtures describe.
const (
	gpu0 = "GPU-4b2e9d1c-7a35-4f08-b6d2-91e0c3a8f754"
	gpu1 = "GPU-a7c01f6e-2d94-4b3a-8e51-6f9d2b0c4e18"
)

// A node as tests/cdi_specs.rs has gpu-share write for it: NVIDIA's spec, and the reservation of
// one GPU.
type node struct {
	dir    string // its written specs, under written/
	nvidia string // NVIDIA's spec, under nvidia/
	uuid   string
	index  int
	// The GPU's name in NVIDIA's spec.
	nvidiaName string
	// What NVIDIA's spec gives: the memory-limit hook; the DRM nodes' groups.
	memoryLimits bool
	gids         []uint32
}

var nodes = []node{
	{"nvidia-ctk", "nvidia.yaml", gpu1, 1, "nvidia.com/gpu=1", false, nil},
	{"device-plugin", "k8s.device-plugin.nvidia.com-gpu.json", gpu0, 0, "k8s.device-plugin.nvidia.com/gpu=" + gpu0, false, []uint32{44, 992}},
	{"memory-limits", "nvidia-memory-limits.yaml", gpu1, 1, "nvidia.com/gpu=" + gpu1, true, []uint32{44, 992}},
}

func (n node) mps() string     { return "gpu-share.io/mps=" + n.uuid }
func (n node) gpu() string     { return "gpu-share.io/gpu=" + n.uuid }
func (n node) mpsFile() string { return "gpu-share.io-mps-" + n.uuid + ".json" }
func (n node) gpuFile() string { return "gpu-share.io-gpu-" + n.uuid + ".json" }
func (n node) pipe() string    { return fmt.Sprintf("/run/gpu-share/mps/gpu-%d/pipe", n.index) }
func (n node) shm() string     { return fmt.Sprintf("/run/gpu-share/mps/gpu-%d/shm", n.index) }

// writtenFile is the path of one of gpu-share's spec files of the node.
func (n node) writtenFile(name string) string {
	return filepath.Join(fixtures, "written", n.dir, name)
}

// files are the node's spec files: NVIDIA's, then gpu-share's.
func (n node) files(t *testing.T) []string {
	t.Helper()
	written, err := filepath.Glob(filepath.Join(fixtures, "written", n.dir, "*.json"))
	if err != nil || len(written) != 2 {
		t.Fatalf("%s: gpu-share's two specs (%v, %v); run tests/cdi_specs.rs with GPU_SHARE_UPDATE_GOLDEN=1", n.dir, written, err)
	}
	return append([]string{filepath.Join(fixtures, "nvidia", n.nvidia)}, written...)
}

// TestEveryWrittenNodeIsChecked keeps this test in step with tests/cdi_specs.rs.
func TestEveryWrittenNodeIsChecked(t *testing.T) {
	dirs, err := os.ReadDir(filepath.Join(fixtures, "written"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if !slices.ContainsFunc(nodes, func(n node) bool { return n.dir == d.Name() }) {
			t.Errorf("written/%s: no node of this test reads it", d.Name())
		}
	}
}

// specDir copies files into a new spec directory; edit, when given, changes each spec first
// (then written as JSON, which the library reads whatever the file's extension).
func specDir(t *testing.T, files []string, edit func(*cdispec.Spec)) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			spec, err := cdi.ParseSpec(data)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			edit(spec)
			if data, err = json.Marshal(spec); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// eachNode calls f on every device node of spec, spec-wide and per device.
func eachNode(spec *cdispec.Spec, f func(*cdispec.DeviceNode)) {
	for _, d := range spec.ContainerEdits.DeviceNodes {
		f(d)
	}
	for _, dev := range spec.Devices {
		for _, d := range dev.ContainerEdits.DeviceNodes {
			f(d)
		}
	}
}

// onDevNull points every device node's host path at /dev/null.
func onDevNull(spec *cdispec.Spec) {
	eachNode(spec, func(d *cdispec.DeviceNode) { d.HostPath = "/dev/null" })
}

// cache loads dirs (the later the higher its priority, as /etc/cdi then /var/run/cdi).
func cache(t *testing.T, dirs ...string) (*cdi.Cache, error) {
	t.Helper()
	c, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	return c, c.Refresh()
}

func loaded(t *testing.T, dirs ...string) *cdi.Cache {
	t.Helper()
	c, err := cache(t, dirs...)
	if err != nil {
		t.Fatalf("the specs do not load: %v", err)
	}
	return c
}

// container is a share's container as the runtime has it before CDI: a restricted pod's
// non-root user, the runtime's default mounts (its own /dev/shm among them), and the share's
// environment (its device named in NVIDIA_VISIBLE_DEVICES, its memory limit).
func container(device string) *oci.Spec {
	return &oci.Spec{
		Version: oci.Version,
		Process: &oci.Process{
			User: oci.User{UID: 1000, GID: 1000},
			Args: []string{"python", "train.py"},
			Env: []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"NVIDIA_VISIBLE_DEVICES=" + device,
				"NVIDIA_GPU_MEMORY_LIMIT=20480",
			},
			Cwd: "/",
		},
		Root: &oci.Root{Path: "rootfs"},
		Mounts: []oci.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &oci.Linux{
			Resources: &oci.LinuxResources{Devices: []oci.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}},
		},
	}
}

// inject injects one device into a share's container naming it.
func inject(t *testing.T, c *cdi.Cache, device string) *oci.Spec {
	t.Helper()
	spec := container(device)
	unresolved, err := c.InjectDevices(spec, device)
	if err != nil || unresolved != nil {
		t.Fatalf("%s: %v (unresolved %v)", device, err, unresolved)
	}
	return spec
}

// written reads gpu-share's spec file of a node as the library parses it.
func written(t *testing.T, n node, file string) *cdispec.Spec {
	t.Helper()
	data, err := os.ReadFile(n.writtenFile(file))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cdi.ParseSpec(data)
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

func envOf(spec *oci.Spec, key string) (string, bool) {
	for _, e := range spec.Process.Env {
		if k, v, _ := strings.Cut(e, "="); k == key {
			return v, true
		}
	}
	return "", false
}

func mountsAt(spec *oci.Spec, dest string) []oci.Mount {
	var out []oci.Mount
	for _, m := range spec.Mounts {
		if m.Destination == dest {
			out = append(out, m)
		}
	}
	return out
}

// hooksWith are the hooks whose arguments hold arg (an nvidia-cdi-hook subcommand).
func hooksWith(hooks []oci.Hook, arg string) []oci.Hook {
	var out []oci.Hook
	for _, h := range hooks {
		if slices.Contains(h.Args, arg) {
			out = append(out, h)
		}
	}
	return out
}

func devNull(t *testing.T) (major, minor int64) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/dev/null", &st); err != nil {
		t.Fatal(err)
	}
	return int64(unix.Major(uint64(st.Rdev))), int64(unix.Minor(uint64(st.Rdev)))
}

// TestSpecsLoadAsWritten: NVIDIA's specs and gpu-share's, as the files are, load without an
// error, and every name resolves to a spec of its vendor and class.
func TestSpecsLoadAsWritten(t *testing.T) {
	for _, n := range nodes {
		t.Run(n.dir, func(t *testing.T) {
			c := loaded(t, specDir(t, n.files(t), nil))
			if errs := c.GetErrors(); len(errs) != 0 {
				t.Fatalf("errors: %v", errs)
			}
			names := c.ListDevices()
			for _, want := range []string{n.mps(), n.gpu(), n.nvidiaName} {
				if !slices.Contains(names, want) {
					t.Errorf("%s not among %v", want, names)
				}
			}
			for name, class := range map[string]string{n.mps(): "mps", n.gpu(): "gpu"} {
				spec := c.GetDevice(name).GetSpec()
				if spec.GetVendor() != "gpu-share.io" || spec.GetClass() != class {
					t.Errorf("%s: vendor %q, class %q", name, spec.GetVendor(), spec.GetClass())
				}
				least, err := cdispec.MinimumRequiredVersion(spec.Spec)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s: cdiVersion %s, the library requires at least %s", name, spec.Version, least)
			}
		})
	}
}

// TestInjectedDevice: what the library puts in a share's container for each of gpu-share's
// devices, against what it puts there for NVIDIA's own device of the same GPU.
func TestInjectedDevice(t *testing.T) {
	nullMajor, nullMinor := devNull(t)
	for _, n := range nodes {
		t.Run(n.dir, func(t *testing.T) {
			c := loaded(t, specDir(t, n.files(t), onDevNull))
			mps, gpu, theirs := inject(t, c, n.mps()), inject(t, c, n.gpu()), inject(t, c, n.nvidiaName)

			// Device nodes: each the spec names, a character device with NVIDIA's numbers
			// where NVIDIA's spec gives them (the host's, here /dev/null's, where not), allowed
			// in the device cgroup; owned by the container's user unless the spec names a group.
			want := written(t, n, n.gpuFile()).Devices[0].ContainerEdits.DeviceNodes
			got := gpu.Linux.Devices
			if len(got) != len(want) {
				t.Fatalf("%d device nodes injected, %d in the spec: %+v", len(got), len(want), got)
			}
			for i, w := range want {
				d := got[i]
				major, minor := w.Major, w.Minor
				if major == 0 {
					major, minor = nullMajor, nullMinor
				}
				if d.Path != w.Path || d.Type != "c" || d.Major != major || d.Minor != minor {
					t.Errorf("device %d: %s %s %d:%d, want %s c %d:%d", i, d.Path, d.Type, d.Major, d.Minor, w.Path, major, minor)
				}
				if d.UID == nil || *d.UID != 1000 {
					t.Errorf("%s: uid %v, want the container's 1000", d.Path, d.UID)
				}
				wantGID := uint32(1000)
				if w.GID != nil {
					wantGID = *w.GID
				}
				if d.GID == nil || *d.GID != wantGID {
					t.Errorf("%s: gid %v, want %d", d.Path, d.GID, wantGID)
				}
				allowed := slices.ContainsFunc(gpu.Linux.Resources.Devices, func(r oci.LinuxDeviceCgroup) bool {
					return r.Allow && r.Type == "c" && r.Major != nil && *r.Major == major && r.Minor != nil && *r.Minor == minor && r.Access == "rwm"
				})
				if !allowed {
					t.Errorf("%s: c %d:%d not allowed in the device cgroup", d.Path, major, minor)
				}
			}
			gpuNode := fmt.Sprintf("/dev/nvidia%d", n.index)
			for _, p := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", gpuNode} {
				if !slices.ContainsFunc(got, func(d oci.LinuxDevice) bool { return d.Path == p }) {
					t.Errorf("%s not injected", p)
				}
			}
			if other := fmt.Sprintf("/dev/nvidia%d", 1-n.index); slices.ContainsFunc(got, func(d oci.LinuxDevice) bool { return d.Path == other }) {
				t.Errorf("the other GPU's %s injected", other)
			}

			// Hooks: NVIDIA's driver hooks; the memory-limit hook, for this GPU, where NVIDIA's
			// spec has one.
			for _, h := range []string{"create-symlinks", "update-ldcache", "enable-cuda-compat"} {
				if len(hooksWith(gpu.Hooks.CreateContainer, h)) == 0 {
					t.Errorf("no %s hook", h)
				}
			}
			limits := hooksWith(gpu.Hooks.CreateRuntime, "apply-cuda-memory-limits")
			if n.memoryLimits {
				if len(limits) != 1 || limits[0].Path != "/usr/bin/nvidia-cdi-hook" || !slices.Equal(limits[0].Args[len(limits[0].Args)-2:], []string{"--gpu-id", n.uuid}) {
					t.Errorf("the memory-limit hook: %+v", limits)
				}
			} else if len(limits) != 0 {
				t.Errorf("a memory-limit hook NVIDIA's spec does not have: %+v", limits)
			}

			// Environment: NVIDIA's edits replace the name the share asked for with "void" in
			// place; the share's memory limit, which the hook reads, stays.
			if v, _ := envOf(gpu, "NVIDIA_VISIBLE_DEVICES"); v != "void" {
				t.Errorf("NVIDIA_VISIBLE_DEVICES=%q", v)
			}
			if v, _ := envOf(gpu, "NVIDIA_GPU_MEMORY_LIMIT"); v != "20480" {
				t.Errorf("NVIDIA_GPU_MEMORY_LIMIT=%q", v)
			}
			if !slices.Equal(gpu.Process.User.AdditionalGids, n.gids) {
				t.Errorf("additional groups %v, want %v", gpu.Process.User.AdditionalGids, n.gids)
			}

			// The time-sliced device puts in the container exactly what NVIDIA's own device
			// of the GPU does.
			same(t, "gpu-share.io/gpu against NVIDIA's device", gpu, theirs)

			// The MPS device: the same, plus the daemon's pipe, its /dev/shm in place of the
			// runtime's, and the pipe's variable.
			same(t, "device nodes", mps.Linux.Devices, gpu.Linux.Devices)
			same(t, "hooks", mps.Hooks, gpu.Hooks)
			same(t, "additional groups", mps.Process.User.AdditionalGids, gpu.Process.User.AdditionalGids)
			if v, ok := envOf(mps, "CUDA_MPS_PIPE_DIRECTORY"); !ok || v != n.pipe() {
				t.Errorf("CUDA_MPS_PIPE_DIRECTORY=%q", v)
			}
			if _, ok := envOf(gpu, "CUDA_MPS_PIPE_DIRECTORY"); ok {
				t.Error("CUDA_MPS_PIPE_DIRECTORY in the time-sliced share")
			}
			pipe := mountsAt(mps, n.pipe())
			if len(pipe) != 1 || pipe[0].Source != n.pipe() || !slices.Contains(pipe[0].Options, "rbind") {
				t.Errorf("the pipe: %+v", pipe)
			}
			shm := mountsAt(mps, "/dev/shm")
			if len(shm) != 1 || shm[0].Source != n.shm() || shm[0].Type != "" || !slices.Contains(shm[0].Options, "rbind") {
				t.Errorf("/dev/shm: %+v", shm)
			}
			if shm := mountsAt(gpu, "/dev/shm"); len(shm) != 1 || shm[0].Source != "shm" {
				t.Errorf("the time-sliced share's /dev/shm: %+v", shm)
			}
			if len(mps.Mounts) != len(gpu.Mounts)+1 {
				t.Errorf("%d mounts with MPS, %d without", len(mps.Mounts), len(gpu.Mounts))
			}
			// The runtime mounts /dev before what is under it.
			dev := slices.IndexFunc(mps.Mounts, func(m oci.Mount) bool { return m.Destination == "/dev" })
			at := slices.IndexFunc(mps.Mounts, func(m oci.Mount) bool { return m.Destination == "/dev/shm" })
			if dev < 0 || at < dev {
				t.Errorf("/dev at %d, /dev/shm at %d", dev, at)
			}
		})
	}
}

// same fails when got and want differ, shown as JSON.
func same(t *testing.T, what string, got, want any) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("%s differ:\n got %s\nwant %s", what, g, w)
	}
}

// TestHostDeviceNodes: the library reads each device node's type on the host at injection;
// NVIDIA's specs give no type, so a node missing on the host fails the container's creation,
// even where NVIDIA's spec gives the node's numbers.
func TestHostDeviceNodes(t *testing.T) {
	for _, n := range nodes {
		t.Run(n.dir, func(t *testing.T) {
			// A node missing on the host.
			missing := filepath.Join(t.TempDir(), "dev")
			c := loaded(t, specDir(t, n.files(t), func(s *cdispec.Spec) {
				eachNode(s, func(d *cdispec.DeviceNode) { d.HostPath = filepath.Join(missing, d.Path) })
			}))
			for _, name := range []string{n.mps(), n.gpu()} {
				unresolved, err := c.InjectDevices(container(name), name)
				if err == nil || unresolved != nil || !strings.Contains(err.Error(), "failed to stat CDI host device") || !strings.Contains(err.Error(), missing) {
					t.Errorf("%s: %v (unresolved %v)", name, err, unresolved)
				}
			}

			// A host path that is no device node.
			file := filepath.Join(t.TempDir(), "not-a-device")
			if err := os.WriteFile(file, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			c = loaded(t, specDir(t, n.files(t), func(s *cdispec.Spec) {
				eachNode(s, func(d *cdispec.DeviceNode) { d.HostPath = file })
			}))
			if _, err := c.InjectDevices(container(n.gpu()), n.gpu()); err == nil || !strings.Contains(err.Error(), "not a device node") {
				t.Errorf("a regular file as the device node: %v", err)
			}

			// A node with its type and numbers given needs nothing on the host.
			c = loaded(t, specDir(t, n.files(t), func(s *cdispec.Spec) {
				eachNode(s, func(d *cdispec.DeviceNode) {
					d.HostPath = filepath.Join(missing, d.Path)
					d.Type = "c"
					if d.Major == 0 {
						d.Major = 195
					}
				})
			}))
			spec := inject(t, c, n.gpu())
			gpuNode := fmt.Sprintf("/dev/nvidia%d", n.index)
			if i := slices.IndexFunc(spec.Linux.Devices, func(d oci.LinuxDevice) bool { return d.Path == gpuNode }); i < 0 || spec.Linux.Devices[i].Major != 195 {
				t.Errorf("%s: %+v", gpuNode, spec.Linux.Devices)
			}

			// The specs as written, on this machine: the first of the device's nodes this
			// machine lacks fails the injection; a machine with them all injects.
			c = loaded(t, specDir(t, n.files(t), nil))
			var lacking string
			for _, d := range written(t, n, n.gpuFile()).Devices[0].ContainerEdits.DeviceNodes {
				host := d.HostPath
				if host == "" {
					host = d.Path
				}
				if _, err := os.Lstat(host); err != nil {
					lacking = host
					break
				}
			}
			unresolved, err := c.InjectDevices(container(n.gpu()), n.gpu())
			switch {
			case lacking == "" && err != nil:
				t.Errorf("this machine has every node, yet: %v", err)
			case lacking != "" && (err == nil || unresolved != nil || !strings.Contains(err.Error(), fmt.Sprintf("failed to stat CDI host device %q", lacking))):
				t.Errorf("this machine lacks %s: %v (unresolved %v)", lacking, err, unresolved)
			default:
				t.Logf("as written, on this machine: %v", err)
			}
		})
	}
}

// TestUnresolvable: a name no spec defines is the library's "unresolvable CDI devices", and
// nothing is injected, not even the names that do resolve.
func TestUnresolvable(t *testing.T) {
	n := nodes[2]
	c := loaded(t, specDir(t, n.files(t), onDevNull))
	never := "gpu-share.io/gpu=GPU-00000000-0000-0000-0000-000000000000"
	for _, names := range [][]string{{never}, {n.mps(), never}, {"gpu-share.io/mps=" + gpu0}} {
		spec := container(names[0])
		unresolved, err := c.InjectDevices(spec, names...)
		missing := names[len(names)-1]
		if err == nil || !strings.Contains(err.Error(), "unresolvable CDI devices "+missing) || !slices.Equal(unresolved, []string{missing}) {
			t.Errorf("%v: %v (unresolved %v)", names, err, unresolved)
		}
		same(t, "the container after an unresolvable name", spec, container(names[0]))
	}
}

// TestConflict: two files of one directory defining one name make it the library's
// "conflicting device", and so unresolvable; the same name in a directory of higher priority
// (/var/run/cdi after /etc/cdi) is no conflict: it wins, silently.
func TestConflict(t *testing.T) {
	n := nodes[2]
	files := n.files(t)
	dir := specDir(t, files, onDevNull)
	gpuFile := filepath.Join(dir, n.gpuFile())
	data, err := os.ReadFile(gpuFile)
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "gpu-share.io-gpu-earlier.json")
	if err := os.WriteFile(other, data, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := cache(t, dir)
	want := fmt.Sprintf("conflicting device %q", n.gpu())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("want %s: %v", want, err)
	}
	errs := c.GetErrors()
	for _, f := range []string{gpuFile, other} {
		if len(errs[f]) == 0 {
			t.Errorf("no error recorded for %s: %v", f, errs)
		}
	}
	if slices.Contains(c.ListDevices(), n.gpu()) {
		t.Errorf("%s still listed", n.gpu())
	}
	unresolved, err := c.InjectDevices(container(n.gpu()), n.gpu())
	if err == nil || !strings.Contains(err.Error(), "unresolvable CDI devices "+n.gpu()) || !slices.Equal(unresolved, []string{n.gpu()}) {
		t.Errorf("the conflicting name: %v (unresolved %v)", err, unresolved)
	}
	// The other names of the directory still resolve.
	inject(t, c, n.mps())

	// The same name in /etc/cdi and in /var/run/cdi: the latter's, and no error.
	etc := specDir(t, []string{n.writtenFile(n.gpuFile())}, func(s *cdispec.Spec) {
		onDevNull(s)
		s.Devices[0].ContainerEdits.Env = append(s.Devices[0].ContainerEdits.Env, "FROM_ETC=1")
	})
	run := specDir(t, files, onDevNull)
	c = loaded(t, etc, run)
	spec := inject(t, c, n.gpu())
	if _, ok := envOf(spec, "FROM_ETC"); ok {
		t.Error("the device of lower priority was injected")
	}
	if got := c.GetDevice(n.gpu()).GetSpec().GetPath(); got != filepath.Join(run, n.gpuFile()) {
		t.Errorf("resolved from %s", got)
	}
}

// TestVersions: the library refuses a spec whose cdiVersion is below what its contents need
// (additionalGids need 0.7.0), or a version it does not know; the spec's names then resolve to
// nothing.
func TestVersions(t *testing.T) {
	n := nodes[2]
	for version, want := range map[string]string{
		"0.5.0": "the spec version must be at least v0.7.0",
		"1.9.0": `invalid version "1.9.0"`,
	} {
		c, err := cache(t, specDir(t, []string{n.writtenFile(n.gpuFile())}, func(s *cdispec.Spec) { s.Version = version }))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("cdiVersion %s: want %q, got %v", version, want, err)
		}
		if c.GetDevice(n.gpu()) != nil {
			t.Errorf("cdiVersion %s: %s still resolves", version, n.gpu())
		}
	}
}
