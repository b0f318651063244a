package plugin

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func cdiConfig(dir, strategy, idStrategy string) string {
	return `{"flags": {"migStrategy": "mixed", "plugin": {"deviceListStrategy": "` + strategy + `", "deviceIDStrategy": "` + idStrategy + `"}},
	"standin": {"deviceDir": "` + dir + `/dev", "libDir": "` + dir + `/lib", "nvmlLogDir": "` + dir + `/nvml", "driverVersion": "535.1.2", "gpus": [
	{"index": 0, "uuid": "` + u0 + `", "mig": [{"profile": "1g.10gb", "uuid": "` + m0 + `", "gpuInstance": 9, "computeInstance": 0}]},
	{"index": 1, "minor": 5, "uuid": "` + u1 + `"}]}}`
}

func deviceNames(s *CDISpec) []string {
	var out []string
	for _, d := range s.Devices {
		out = append(out, d.Name)
	}
	return out
}

func TestCDISpecDevicePluginForm(t *testing.T) {
	dir := t.TempDir()
	c := mustConfig(t, cdiConfig(dir, "cdi-cri", "uuid"))
	path := filepath.Join(dir, "cdi", SpecFileName(FormDevicePlugin))
	if err := WriteCDISpec(c, FormDevicePlugin, path); err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "file", filepath.Base(path), "k8s.device-plugin.nvidia.com-gpu.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec CDISpec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatalf("parse back: %v", err)
	}
	wantEqual(t, "kind and version", []string{spec.Kind, spec.Version}, []string{"k8s.device-plugin.nvidia.com/gpu", "0.5.0"})
	// GPU 0 is in MIG mode: its MIG device is listed, not the GPU.
	wantEqual(t, "names", deviceNames(&spec), []string{u1, m0})
	wantEqual(t, "GPU 1", spec.Devices[0].ContainerEdits, CDIEdits{
		Env:         []string{"GPU_SHARE_STANDIN_GPU_5=" + u1},
		DeviceNodes: []CDIDeviceNode{{Path: "/dev/nvidia5", HostPath: dir + "/dev/nvidia5"}},
	})
	wantEqual(t, "MIG device", spec.Devices[1].ContainerEdits, CDIEdits{
		Env: []string{"GPU_SHARE_STANDIN_GPU_0=" + u0, "GPU_SHARE_STANDIN_MIG_0_9_0=" + m0},
		DeviceNodes: []CDIDeviceNode{
			{Path: "/dev/nvidia0", HostPath: dir + "/dev/nvidia0"},
			{Path: "/dev/nvidia-caps/nvidia-cap84", HostPath: dir + "/dev/nvidia-caps/nvidia-cap84"},
			{Path: "/dev/nvidia-caps/nvidia-cap85", HostPath: dir + "/dev/nvidia-caps/nvidia-cap85"},
		},
	})
	opts := []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}
	wantEqual(t, "common edits", spec.ContainerEdits, CDIEdits{
		Env: []string{"GPU_SHARE_STANDIN_NVML_LOG=/run/gpu-share-standin/nvml", "NVIDIA_VISIBLE_DEVICES=void"},
		DeviceNodes: []CDIDeviceNode{
			{Path: "/dev/nvidiactl", HostPath: dir + "/dev/nvidiactl"},
			{Path: "/dev/nvidia-uvm", HostPath: dir + "/dev/nvidia-uvm"},
			{Path: "/dev/nvidia-uvm-tools", HostPath: dir + "/dev/nvidia-uvm-tools"},
		},
		Mounts: []CDIMount{
			{HostPath: dir + "/lib/libnvidia-ml.so.535.1.2", ContainerPath: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.1.2", Options: opts},
			{HostPath: dir + "/lib/libnvidia-ml.so.1", ContainerPath: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", Options: opts},
			{HostPath: dir + "/nvml", ContainerPath: "/run/gpu-share-standin/nvml", Options: []string{"rw", "nosuid", "nodev", "rbind", "rprivate"}},
		},
	})

	// The device names are those Allocate answers with.
	n, err := NewNode(c)
	if err != nil {
		t.Fatal(err)
	}
	r := allocate(t, n, "nvidia.com/mig-1g.10gb", m0)
	wantEqual(t, "allocated name resolves", r.CdiDevices[0].Name, "k8s.device-plugin.nvidia.com/gpu="+spec.Devices[1].Name)
}

func TestCDISpecDevicePluginFormByIndex(t *testing.T) {
	spec, err := BuildCDISpec(mustConfig(t, cdiConfig("/x", "cdi-annotations", "index")), FormDevicePlugin)
	if err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "names", deviceNames(spec), []string{"1", "0:0"})
}

func TestCDISpecNvidiaCTKForm(t *testing.T) {
	dir := t.TempDir()
	c := mustConfig(t, cdiConfig(dir, "envvar", "uuid"))
	path := filepath.Join(dir, "cdi", SpecFileName(FormNvidiaCTK))
	if err := WriteCDISpec(c, FormNvidiaCTK, path); err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "file", filepath.Base(path), "nvidia.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(strings.TrimSpace(string(b)), "{") {
		t.Fatalf("a .yaml spec must be written as YAML:\n%s", b)
	}
	var spec CDISpec
	if err := yaml.Unmarshal(b, &spec); err != nil {
		t.Fatalf("parse back: %v", err)
	}
	wantEqual(t, "kind", spec.Kind, "nvidia.com/gpu")
	wantEqual(t, "names", deviceNames(&spec), []string{"1", u1, "0:0", m0, "all"})
	all := spec.Devices[4].ContainerEdits
	wantEqual(t, "all's env", all.Env, []string{"GPU_SHARE_STANDIN_GPU_5=" + u1, "GPU_SHARE_STANDIN_GPU_0=" + u0, "GPU_SHARE_STANDIN_MIG_0_9_0=" + m0})
	if len(all.DeviceNodes) != 4 {
		t.Fatalf("all's device nodes: %+v", all.DeviceNodes)
	}
	if _, err := BuildCDISpec(c, "operator"); err == nil {
		t.Fatal("an unknown form must fail")
	}
}

// TestCDISpecsInjectWithTheCDIPackage reads both specs with the CDI package container
// runtimes use, and injects devices into an OCI spec: the device nodes come out as the
// stand-in char devices 1:3, with each GPU's marker and the NVML library mounts.
func TestCDISpecsInjectWithTheCDIPackage(t *testing.T) {
	dir := t.TempDir()
	c := mustConfig(t, cdiConfig(dir, "cdi-cri", "uuid"))
	made, err := MakeDeviceNodes(c, "")
	if errors.Is(err, syscall.EPERM) {
		t.Skipf("mknod not permitted here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "nodes", made, []string{
		dir + "/dev/nvidia-caps/nvidia-cap84", dir + "/dev/nvidia-caps/nvidia-cap85",
		dir + "/dev/nvidia-uvm", dir + "/dev/nvidia-uvm-tools", dir + "/dev/nvidia0", dir + "/dev/nvidia5", dir + "/dev/nvidiactl",
	})
	// Making them again keeps them.
	if again, err := MakeDeviceNodes(c, ""); err != nil || len(again) != len(made) {
		t.Fatalf("again: %v %v", again, err)
	}
	cdiDir := filepath.Join(dir, "cdi")
	for _, form := range []string{FormDevicePlugin, FormNvidiaCTK} {
		if err := WriteCDISpec(c, form, filepath.Join(cdiDir, SpecFileName(form))); err != nil {
			t.Fatal(err)
		}
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI errors: %v", errs)
	}
	devices := cache.ListDevices()
	for _, want := range []string{
		"k8s.device-plugin.nvidia.com/gpu=" + u1, "k8s.device-plugin.nvidia.com/gpu=" + m0,
		"nvidia.com/gpu=0:0", "nvidia.com/gpu=1", "nvidia.com/gpu=" + u1, "nvidia.com/gpu=all",
	} {
		if !slices.Contains(devices, want) {
			t.Fatalf("%s not among %v", want, devices)
		}
	}

	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, "k8s.device-plugin.nvidia.com/gpu="+u1); err != nil {
		t.Fatalf("inject: %v", err)
	}
	var nodes []string
	for _, d := range spec.Linux.Devices {
		if d.Type != "c" || d.Major != 1 || d.Minor != 3 {
			t.Fatalf("device %s is %s %d:%d, want c 1:3", d.Path, d.Type, d.Major, d.Minor)
		}
		nodes = append(nodes, d.Path)
	}
	slices.Sort(nodes)
	wantEqual(t, "injected nodes", nodes, []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia5", "/dev/nvidiactl"})
	if !slices.Contains(spec.Process.Env, "GPU_SHARE_STANDIN_GPU_5="+u1) || slices.ContainsFunc(spec.Process.Env, func(e string) bool { return strings.HasPrefix(e, "GPU_SHARE_STANDIN_GPU_0=") }) {
		t.Fatalf("env: %v", spec.Process.Env)
	}
	var mounts []string
	for _, m := range spec.Mounts {
		mounts = append(mounts, m.Destination)
	}
	// The CDI package orders mounts by depth.
	wantEqual(t, "mounts", mounts, []string{"/run/gpu-share-standin/nvml", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.1.2", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"})

	spec = &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, "nvidia.com/gpu=all"); err != nil {
		t.Fatalf("inject all: %v", err)
	}
	if len(spec.Linux.Devices) != 7 {
		t.Fatalf("all: %d devices, want 7: %+v", len(spec.Linux.Devices), spec.Linux.Devices)
	}
}

func TestMigCapMinors(t *testing.T) {
	gi, ci := MigCapMinors(0, 0, 0)
	gi2, ci2 := MigCapMinors(0, 1, 7)
	gi3, _ := MigCapMinors(1, 0, 0)
	wantEqual(t, "minors", []int{gi, ci, gi2, ci2, gi3}, []int{3, 4, 12, 20, 138})
}

// TestCDISpecFormsMountTheMPSControl: with standin.binDir, both forms mount the stand-in MPS
// control program spec-wide where NVIDIA's specs mount the driver's, and the runtime's CDI
// package injects it; without it, no binary.
func TestCDISpecFormsMountTheMPSControl(t *testing.T) {
	dir := t.TempDir()
	body := cdiConfig(dir, "cdi-cri", "uuid")
	withBin := strings.Replace(body, `"standin": {`, `"standin": {"binDir": "`+dir+`/bin", `, 1)
	if withBin == body {
		t.Fatal("the config has no standin section to add binDir to")
	}
	c := mustConfig(t, withBin)
	wantEqual(t, "binDir", c.Standin.BinDir, dir+"/bin")
	control := CDIMount{
		HostPath:      dir + "/bin/nvidia-cuda-mps-control",
		ContainerPath: "/usr/bin/nvidia-cuda-mps-control",
		Options:       []string{"ro", "nosuid", "nodev", "rbind", "rprivate"},
	}
	binaries := func(s *CDISpec) []CDIMount {
		var out []CDIMount
		for _, m := range s.ContainerEdits.Mounts {
			if strings.HasPrefix(m.ContainerPath, "/usr/bin/") {
				out = append(out, m)
			}
		}
		for _, d := range s.Devices {
			for _, m := range d.ContainerEdits.Mounts {
				t.Fatalf("device %s mounts %+v: binaries are spec-wide", d.Name, m)
			}
		}
		return out
	}
	spec, err := BuildCDISpec(c, FormNvidiaCTK)
	if err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "nvidia-ctk form, binDir set", binaries(spec), []CDIMount{control})
	// The library mounts and the NVML log stay as they were.
	wantEqual(t, "spec-wide mounts", len(spec.ContainerEdits.Mounts), 4)
	spec, err = BuildCDISpec(c, FormDevicePlugin)
	if err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "device-plugin form, binDir set", binaries(spec), []CDIMount{control})
	spec, err = BuildCDISpec(mustConfig(t, body), FormNvidiaCTK)
	if err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "nvidia-ctk form, no binDir", binaries(spec), []CDIMount(nil))

	// Written as YAML and read by the runtime's CDI package, any of the spec's devices brings
	// the program.
	t.Run("injected", func(t *testing.T) {
		injectMPSControl(t, c, dir)
	})
}

func injectMPSControl(t *testing.T, c *Config, dir string) {
	if _, err := MakeDeviceNodes(c, ""); errors.Is(err, syscall.EPERM) {
		t.Skipf("mknod not permitted here: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	cdiDir := filepath.Join(dir, "cdi")
	if err := WriteCDISpec(c, FormNvidiaCTK, filepath.Join(cdiDir, SpecFileName(FormNvidiaCTK))); err != nil {
		t.Fatal(err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI errors: %v", errs)
	}
	for _, device := range []string{"nvidia.com/gpu=" + u1, "nvidia.com/gpu=0:0", "nvidia.com/gpu=all"} {
		injected := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
		if _, err := cache.InjectDevices(injected, device); err != nil {
			t.Fatalf("inject %s: %v", device, err)
		}
		var got []string
		for _, m := range injected.Mounts {
			if m.Destination == "/usr/bin/nvidia-cuda-mps-control" {
				got = append(got, m.Source, strings.Join(m.Options, ","))
			}
		}
		wantEqual(t, device+": the control's mount", got, []string{dir + "/bin/nvidia-cuda-mps-control", "ro,nosuid,nodev,rbind,rprivate"})
	}
}
