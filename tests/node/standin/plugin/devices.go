package plugin

import (
	"fmt"
	"log"
	"sort"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Device is one advertised device: a GPU, a MIG device, or a replica of either, as
// internal/rm/devices.go's Device.
type Device struct {
	// ID is what kubelet sees: the UUID, or <UUID>::<replica> for a replica
	// (internal/rm/devices.go's NewAnnotatedID).
	ID string
	// Index is the GPU's index, or <gpu>:<mig> for a MIG device (internal/rm/nvml_devices.go's
	// newNvmlGPUDevice and newMigDevice).
	Index string
	// Paths are the device nodes in the container (internal/rm/nvml_devices.go's GetPaths).
	Paths             []string
	TotalMemory       uint64
	ComputeCapability string
	// Replicas is how many replicas the GPU was split into (0: not shared).
	Replicas int
	GPU      *GPU
	MIG      *MIGDevice
}

// UUID is the device's UUID, without the replica annotation (internal/rm/devices.go's
// Device.GetUUID).
func (d *Device) UUID() string { return AnnotatedID(d.ID) }

// IsMigDevice says whether the device is a MIG device (internal/rm/devices.go).
func (d *Device) IsMigDevice() bool { return strings.Contains(d.Index, ":") }

// pluginDevice is the device as ListAndWatch sends it (internal/rm/devices.go's BuildDevice).
func (d *Device) pluginDevice() *pluginapi.Device {
	pd := &pluginapi.Device{ID: d.ID, Health: pluginapi.Healthy}
	if d.GPU.NUMANode != nil && *d.GPU.NUMANode >= 0 {
		pd.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(*d.GPU.NUMANode)}}}
	}
	return pd
}

// NewAnnotatedID is <id>::<replica> (internal/rm/devices.go's NewAnnotatedID).
func NewAnnotatedID(id string, replica int) string {
	return fmt.Sprintf("%s::%d", id, replica)
}

// AnnotatedID strips the replica annotation (internal/rm/devices.go's AnnotatedID.GetID).
func AnnotatedID(id string) string {
	base, _, _ := strings.Cut(id, "::")
	return base
}

func hasAnnotation(id string) bool { return strings.Contains(id, "::") }

// Resource is one extended resource and its devices, in a stable order (GPU index, MIG index,
// replica).
type Resource struct {
	Name    string
	Devices []*Device
	byID    map[string]*Device
}

func (r *Resource) add(d *Device) {
	if r.byID == nil {
		r.byID = map[string]*Device{}
	}
	if _, dup := r.byID[d.ID]; dup {
		return
	}
	r.byID[d.ID] = d
	r.Devices = append(r.Devices, d)
}

// Get is the device with the ID, or nil.
func (r *Resource) Get(id string) *Device { return r.byID[id] }

// IDs are the devices' IDs.
func (r *Resource) IDs() []string {
	ids := make([]string, len(r.Devices))
	for i, d := range r.Devices {
		ids[i] = d.ID
	}
	return ids
}

// MigResourceName is the resource a MIG profile is advertised as under the mixed strategy,
// or "" for a profile NVIDIA's plugin advertises under none (internal/rm/rm.go's
// AddDefaultResourcesToConfig: only profiles whose compute slices equal their GPU slices,
// named mig-<profile> with '+' made '.').
func MigResourceName(profile string) string {
	m := migProfile.FindStringSubmatch(profile)
	if m == nil {
		return ""
	}
	if m[1] != "" && m[1] != m[2] {
		return ""
	}
	canonical := strings.TrimPrefix(profile, m[1]+"c.")
	if m[1] == "" {
		canonical = profile
	}
	return ResourceNamePrefix + "/" + strings.ReplaceAll("mig-"+canonical, "+", ".")
}

// MigCapMinors are the minors of the MIG device's GPU-instance and compute-instance access
// capabilities (/dev/nvidia-caps/nvidia-cap<n>), laid out as the driver's
// /proc/driver/nvidia-caps/mig-minors lists them: config 1, monitor 2, then per GPU 15 GPU
// instances of 9 entries each (the instance's access, then its 8 compute instances').
func MigCapMinors(gpuMinor, gi, ci int) (int, int) {
	base := 3 + gpuMinor*15*9 + gi*9
	return base, base + 1 + ci
}

// migPaths are a MIG device's device nodes (internal/rm/nvml_devices.go's nvmlMigDevice.GetPaths).
func migPaths(g *GPU, m *MIGDevice) []string {
	giCap, ciCap := MigCapMinors(g.MinorNumber(), m.GPUInstance, m.ComputeInstance)
	return []string{
		fmt.Sprintf("/dev/nvidia%d", g.MinorNumber()),
		fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", giCap),
		fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", ciCap),
	}
}

func migMemoryMiB(m *MIGDevice) uint64 {
	if m.MemoryMiB > 0 {
		return m.MemoryMiB
	}
	if p := migProfile.FindStringSubmatch(m.Profile); p != nil {
		gb, _ := strconv.ParseUint(p[3], 10, 64)
		return gb * 1024
	}
	return 0
}

func gpuDevice(g *GPU) *Device {
	return &Device{
		ID:                g.UUID,
		Index:             strconv.Itoa(g.Index),
		Paths:             []string{fmt.Sprintf("/dev/nvidia%d", g.MinorNumber())},
		TotalMemory:       g.MemoryMiB * 1024 * 1024,
		ComputeCapability: g.ComputeCapability,
		GPU:               g,
	}
}

func migDevice(g *GPU, j int) *Device {
	m := &g.MIG[j]
	return &Device{
		ID:                m.UUID,
		Index:             fmt.Sprintf("%d:%d", g.Index, j),
		Paths:             migPaths(g, m),
		TotalMemory:       migMemoryMiB(m) * 1024 * 1024,
		ComputeCapability: g.ComputeCapability,
		GPU:               g,
		MIG:               m,
	}
}

type deviceMap struct {
	names []string
	byRes map[string]*Resource
}

func (dm *deviceMap) insert(name string, d *Device) {
	if dm.byRes == nil {
		dm.byRes = map[string]*Resource{}
	}
	r := dm.byRes[name]
	if r == nil {
		r = &Resource{Name: name}
		dm.byRes[name] = r
		dm.names = append(dm.names, name)
	}
	r.add(d)
}

func (dm *deviceMap) empty() bool {
	for _, r := range dm.byRes {
		if len(r.Devices) > 0 {
			return false
		}
	}
	return true
}

// BuildResources builds the advertised resources, as internal/rm/device_map.go's
// deviceMapBuilder.build with the default resources of internal/rm/rm.go's
// AddDefaultResourcesToConfig, then checks MPS as internal/plugin/mps.go's getMPSOptions and
// cmd/mps-control-daemon/mps/device.go's assertReplicas do. Resources come sorted by name.
func BuildResources(c *Config) ([]*Resource, error) {
	gpus, err := buildFromConfigResources(c)
	if err != nil {
		return nil, fmt.Errorf("error building device map from config.resources: %v", err)
	}
	shared, err := withReplicas(c.ReplicatedResources(), gpus)
	if err != nil {
		return nil, fmt.Errorf("error updating device map with replicas from replicatedResources config: %v", err)
	}
	var out []*Resource
	for _, name := range shared.names {
		if r := shared.byRes[name]; len(r.Devices) > 0 {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if c.SharingStrategy() == SharingStrategyMPS {
		for _, r := range out {
			for _, d := range r.Devices {
				if d.IsMigDevice() {
					return nil, fmt.Errorf("failed to create plugin: sharing using MPS is not supported for MIG devices")
				}
				if max := mpsMaxClients(d.ComputeCapability); d.Replicas > max {
					return nil, fmt.Errorf("invalid device maximum allowed replicas exceeded: %d > %d", d.Replicas, max)
				}
			}
		}
	}
	return out, nil
}

// mpsMaxClients is 48 from compute capability 7.5 and 16 before
// (cmd/mps-control-daemon/mps/device.go's maxClients).
func mpsMaxClients(cc string) int {
	major, minor, _ := strings.Cut(cc, ".")
	ma, _ := strconv.Atoi(major)
	mi, _ := strconv.Atoi(minor)
	if ma > 7 || (ma == 7 && mi >= 5) {
		return 48
	}
	return 16
}

// buildFromConfigResources follows internal/rm/device_map.go's
// buildDeviceMapFromConfigResources.
func buildFromConfigResources(c *Config) (*deviceMap, error) {
	strategy := c.Flags.MigStrategy
	gpus := &deviceMap{}
	for i := range c.Standin.GPUs {
		g := &c.Standin.GPUs[i]
		if g.IsMigEnabled() && strategy != MigStrategyNone {
			continue
		}
		gpus.insert(ResourceNamePrefix+"/gpu", gpuDevice(g))
	}
	if strategy == MigStrategyNone {
		return gpus, nil
	}

	migs := &deviceMap{}
	for i := range c.Standin.GPUs {
		g := &c.Standin.GPUs[i]
		if !g.IsMigEnabled() {
			continue
		}
		for j := range g.MIG {
			name := ResourceNamePrefix + "/gpu"
			if strategy == MigStrategyMixed {
				name = MigResourceName(g.MIG[j].Profile)
				if name == "" {
					return nil, fmt.Errorf("error building MIG device map: MIG profile '%v' does not match any resource patterns", g.MIG[j].Profile)
				}
			}
			migs.insert(name, migDevice(g, j))
		}
	}

	uniform := strategy == MigStrategySingle
	// assertAllMigDevicesAreValid.
	for i := range c.Standin.GPUs {
		g := &c.Standin.GPUs[i]
		if g.IsMigEnabled() && len(g.MIG) == 0 {
			if uniform {
				return nil, fmt.Errorf("invalid MIG configuration: at least one device with migEnabled=true was not configured correctly: device %v has no MIG devices configured", i)
			}
			log.Printf("device %v has no MIG devices configured", i)
		}
	}
	if uniform {
		var first *MIGDevice
		for i := range c.Standin.GPUs {
			g := &c.Standin.GPUs[i]
			if !g.IsMigEnabled() {
				continue
			}
			for j := range g.MIG {
				m := &g.MIG[j]
				if first == nil {
					first = m
				} else if m.Profile != first.Profile || migMemoryMiB(m) != migMemoryMiB(first) {
					return nil, fmt.Errorf("invalid MIG configuration: more than one MIG device type present on node")
				}
			}
		}
		if !gpus.empty() && !migs.empty() {
			return nil, fmt.Errorf("all devices on the node must be configured with the same migEnabled value")
		}
	}
	for _, name := range migs.names {
		for _, d := range migs.byRes[name].Devices {
			gpus.insert(name, d)
		}
	}
	return gpus, nil
}

// withReplicas follows internal/rm/device_map.go's updateDeviceMapWithReplicas: every device
// of a replicated resource becomes Replicas devices <id>::0..<id>::<n-1> under the resource's
// rename (or its own name).
func withReplicas(rrs *ReplicatedResources, in *deviceMap) (*deviceMap, error) {
	replicated := map[string]bool{}
	for _, r := range rrs.Resources {
		replicated[r.Name] = true
	}
	out := &deviceMap{}
	for _, name := range in.names {
		if !replicated[name] {
			for _, d := range in.byRes[name].Devices {
				out.insert(name, d)
			}
		}
	}
	for _, r := range rrs.Resources {
		src := in.byRes[r.Name]
		if src == nil || len(src.Devices) == 0 {
			continue
		}
		name := r.Name
		if r.Rename != "" {
			name = r.Rename
		}
		for _, d := range src.Devices {
			for i := 0; i < r.Replicas; i++ {
				rd := *d
				rd.ID = NewAnnotatedID(d.ID, i)
				rd.Replicas = r.Replicas
				out.insert(name, &rd)
			}
		}
	}
	return out, nil
}
