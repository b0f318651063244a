package plugin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// CDI spec forms.
const (
	// FormDevicePlugin is the spec NVIDIA's device plugin writes when a CDI strategy is on:
	// kind k8s.device-plugin.nvidia.com/gpu, one device per GPU (and per MIG device) named as
	// the deviceIDStrategy names it, in <cdi-dir>/k8s.device-plugin.nvidia.com-gpu.json
	// (internal/cdi/cdi.go's New and CreateSpecFile).
	FormDevicePlugin = "device-plugin"
	// FormNvidiaCTK is the spec `nvidia-ctk cdi generate` writes (and the GPU Operator's and
	// the toolkit's nvidia-cdi-refresh): kind nvidia.com/gpu, each device named by index and by
	// UUID, plus the merged device "all" (nvidia-container-toolkit's
	// cmd/nvidia-ctk/cdi/generate/generate.go: device-name-strategy defaults to index and uuid,
	// and the all device comes from transform.NewMergedDevice).
	FormNvidiaCTK = "nvidia-ctk"

	// NvidiaCTKKind is the kind of the nvidia-ctk form.
	NvidiaCTKKind = "nvidia.com/gpu"
	// NvidiaCTKFile is where nvidia-cdi-refresh puts that spec, under /var/run/cdi.
	NvidiaCTKFile = "nvidia.yaml"

	// CDIVersion is the oldest version with deviceNode hostPath and device names starting with
	// a digit, the version nvcdi's set-minimum-version transform gives such a spec.
	CDIVersion = "0.5.0"

	// libraryDir is where the driver libraries are in the container (a Debian/Ubuntu host's).
	libraryDir = "/usr/lib/x86_64-linux-gnu"
	// binaryDir is where the driver binaries are in the container (a Debian/Ubuntu host's).
	binaryDir = "/usr/bin"
	// MPSControl is the MPS control program, a driver binary the nvidia-ctk form mounts from
	// Standin.BinDir.
	MPSControl = "nvidia-cuda-mps-control"
	// MarkerPrefix names the env a GPU's device sets: GPU_SHARE_STANDIN_GPU_<minor>=<UUID>.
	MarkerPrefix = "GPU_SHARE_STANDIN_GPU_"
	// MIGMarkerPrefix names the env a MIG device sets:
	// GPU_SHARE_STANDIN_MIG_<minor>_<gi>_<ci>=<MIG UUID>.
	MIGMarkerPrefix = "GPU_SHARE_STANDIN_MIG_"
	// NVMLLogEnv names the directory where the stand-in NVML records compute-mode changes.
	NVMLLogEnv = "GPU_SHARE_STANDIN_NVML_LOG"
)

// libraryMountOptions are the options NVIDIA's CDI specs give driver library mounts
// (nvidia-container-toolkit's internal/discover/mounts-to-container-path.go), and driver binary
// mounts too.
var libraryMountOptions = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}

// CDISpec is a CDI spec (the fields the stand-in writes).
type CDISpec struct {
	Version        string      `json:"cdiVersion"`
	Kind           string      `json:"kind"`
	Devices        []CDIDevice `json:"devices"`
	ContainerEdits CDIEdits    `json:"containerEdits,omitempty"`
}

// CDIDevice is one named device of a spec.
type CDIDevice struct {
	Name           string   `json:"name"`
	ContainerEdits CDIEdits `json:"containerEdits"`
}

// CDIEdits are container edits.
type CDIEdits struct {
	Env         []string        `json:"env,omitempty"`
	DeviceNodes []CDIDeviceNode `json:"deviceNodes,omitempty"`
	Mounts      []CDIMount      `json:"mounts,omitempty"`
}

// CDIDeviceNode is a device node; the runtime reads type, major and minor from hostPath, as
// it does for NVIDIA's specs, which give none.
type CDIDeviceNode struct {
	Path     string `json:"path"`
	HostPath string `json:"hostPath,omitempty"`
}

// CDIMount is a bind mount.
type CDIMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options,omitempty"`
}

// Marker is the env a GPU's device sets so that a program in the container (and the stand-in
// NVML) can tell which GPU it got.
func Marker(g *GPU) string {
	return fmt.Sprintf("%s%d=%s", MarkerPrefix, g.MinorNumber(), g.UUID)
}

func migMarker(g *GPU, m *MIGDevice) string {
	return fmt.Sprintf("%s%d_%d_%d=%s", MIGMarkerPrefix, g.MinorNumber(), m.GPUInstance, m.ComputeInstance, m.UUID)
}

// deviceEdits are one device's edits: its device nodes as the stand-in nodes, and its markers.
func (s *Standin) deviceEdits(d *Device) CDIEdits {
	e := CDIEdits{Env: []string{Marker(d.GPU)}}
	if d.MIG != nil {
		e.Env = append(e.Env, migMarker(d.GPU, d.MIG))
	}
	for _, p := range d.Paths {
		e.DeviceNodes = append(e.DeviceNodes, CDIDeviceNode{Path: p, HostPath: s.HostDevicePath(p)})
	}
	return e
}

// commonEdits are the spec-wide edits: the control device nodes (nvcdi's
// controlDeviceNodeDiscoverer, less nvidia-modeset), the driver's NVML library under its
// versioned name and its soname (NVIDIA mounts the versioned file and makes the soname link
// with a hook; the stand-in mounts both, as hooks need NVIDIA's binaries), the stand-in NVML's
// log directory, and NVIDIA_VISIBLE_DEVICES=void (nvcdi's wrapper.GetCommonEdits).
func (s *Standin) commonEdits() CDIEdits {
	var e CDIEdits
	for _, p := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} {
		e.DeviceNodes = append(e.DeviceNodes, CDIDeviceNode{Path: p, HostPath: s.HostDevicePath(p)})
	}
	for _, name := range []string{"libnvidia-ml.so." + s.DriverVersion, "libnvidia-ml.so.1"} {
		e.Mounts = append(e.Mounts, CDIMount{
			HostPath:      filepath.Join(s.LibDir, name),
			ContainerPath: filepath.Join(libraryDir, name),
			Options:       libraryMountOptions,
		})
	}
	if s.NVMLLogDir != "" {
		e.Mounts = append(e.Mounts, CDIMount{
			HostPath:      s.NVMLLogDir,
			ContainerPath: NVMLLogContainerPath,
			Options:       []string{"rw", "nosuid", "nodev", "rbind", "rprivate"},
		})
		e.Env = append(e.Env, NVMLLogEnv+"="+NVMLLogContainerPath)
	}
	e.Env = append(e.Env, "NVIDIA_VISIBLE_DEVICES=void")
	return e
}

// binaryMounts are the stand-in driver binaries in Standin.BinDir, mounted spec-wide where
// NVIDIA's generated specs (nvidia-ctk's and the device plugin's) mount the driver's (nvidia-cuda-mps-control,
// nvidia-cuda-mps-server, nvidia-smi, ... in /usr/bin): only the MPS control, which gpu-share's
// reservation agent runs. None without a BinDir.
func (s *Standin) binaryMounts() []CDIMount {
	if s.BinDir == "" {
		return nil
	}
	return []CDIMount{{
		HostPath:      filepath.Join(s.BinDir, MPSControl),
		ContainerPath: filepath.Join(binaryDir, MPSControl),
		Options:       libraryMountOptions,
	}}
}

// cdiDevices are the GPUs (those not in MIG mode) then the MIG devices, as nvcdi's
// getDeviceSpecGeneratorsForAllDevices visits them whatever the MIG strategy.
func cdiDevices(c *Config) []*Device {
	var out []*Device
	for i := range c.Standin.GPUs {
		if g := &c.Standin.GPUs[i]; !g.IsMigEnabled() {
			out = append(out, gpuDevice(g))
		}
	}
	for i := range c.Standin.GPUs {
		if g := &c.Standin.GPUs[i]; g.IsMigEnabled() {
			for j := range g.MIG {
				out = append(out, migDevice(g, j))
			}
		}
	}
	return out
}

// BuildCDISpec builds the spec of the given form.
func BuildCDISpec(c *Config, form string) (*CDISpec, error) {
	s := &c.Standin
	spec := &CDISpec{Version: CDIVersion, ContainerEdits: s.commonEdits()}
	devices := cdiDevices(c)
	switch form {
	case FormDevicePlugin:
		spec.Kind = CDIVendor + "/" + CDIClass
		for _, d := range devices {
			name := d.UUID()
			if c.Flags.Plugin.DeviceIDStrategy == DeviceIDStrategyIndex {
				name = d.Index
			}
			spec.Devices = append(spec.Devices, CDIDevice{Name: name, ContainerEdits: s.deviceEdits(d)})
		}
	case FormNvidiaCTK:
		spec.Kind = NvidiaCTKKind
		var all CDIEdits
		for _, d := range devices {
			e := s.deviceEdits(d)
			spec.Devices = append(spec.Devices,
				CDIDevice{Name: d.Index, ContainerEdits: e},
				CDIDevice{Name: d.UUID(), ContainerEdits: e})
			all = mergeEdits(all, e)
		}
		spec.Devices = append(spec.Devices, CDIDevice{Name: "all", ContainerEdits: all})
	default:
		return nil, fmt.Errorf("unknown CDI spec form %q (want %s or %s)", form, FormDevicePlugin, FormNvidiaCTK)
	}
	// Both forms come from nvcdi's driver discovery, which mounts the driver's binaries
	// (nvidia-cuda-mps-control among them) beside its libraries.
	spec.ContainerEdits.Mounts = append(spec.ContainerEdits.Mounts, s.binaryMounts()...)
	return spec, nil
}

// mergeEdits adds b's edits to a, each once (nvidia-container-toolkit's
// pkg/nvcdi/transform/merged-device.go and its simplifier).
func mergeEdits(a, b CDIEdits) CDIEdits {
	env := map[string]bool{}
	for _, v := range a.Env {
		env[v] = true
	}
	for _, v := range b.Env {
		if !env[v] {
			env[v] = true
			a.Env = append(a.Env, v)
		}
	}
	nodes := map[string]bool{}
	for _, n := range a.DeviceNodes {
		nodes[n.Path] = true
	}
	for _, n := range b.DeviceNodes {
		if !nodes[n.Path] {
			nodes[n.Path] = true
			a.DeviceNodes = append(a.DeviceNodes, n)
		}
	}
	a.Mounts = append(a.Mounts, b.Mounts...)
	return a
}

// SpecFileName is the file NVIDIA's tooling writes the form's spec to in the CDI directory.
func SpecFileName(form string) string {
	if form == FormNvidiaCTK {
		return NvidiaCTKFile
	}
	return CDIVendor + "-" + CDIClass + ".json"
}

// MarshalCDISpec encodes the spec as the file name's extension says (.yaml/.yml: YAML,
// otherwise JSON), as nvidia-ctk's formatFromFilename does.
func MarshalCDISpec(spec *CDISpec, path string) ([]byte, error) {
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return nil, err
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml":
		return yaml.JSONToYAML(b)
	}
	return append(b, '\n'), nil
}

// WriteCDISpec writes the spec of the form to path, replacing it whole (a temporary file then
// a rename, so the runtime never reads half a spec).
func WriteCDISpec(c *Config, form, path string) error {
	spec, err := BuildCDISpec(c, form)
	if err != nil {
		return err
	}
	b, err := MarshalCDISpec(spec, path)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".standin-cdi-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
