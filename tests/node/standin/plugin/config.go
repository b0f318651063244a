// Package plugin is the stand-in for NVIDIA's k8s-device-plugin on a node without a GPU: it
// advertises the stand-in GPUs under the resource names NVIDIA's plugin uses, answers Allocate
// as NVIDIA's plugin does in each device-list strategy, and writes the CDI specs NVIDIA's
// tooling writes, with harmless device nodes (char 1:3, as /dev/null) in place of the GPUs.
//
// The NVIDIA file and function each behaviour follows is named where it is implemented; the
// paths are those of the NVIDIA/k8s-device-plugin repository unless said otherwise.
package plugin

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// The values NVIDIA's plugin accepts, as api/config/v1/consts.go names them.
const (
	MigStrategyNone   = "none"
	MigStrategySingle = "single"
	MigStrategyMixed  = "mixed"

	DeviceListStrategyEnvVar         = "envvar"
	DeviceListStrategyVolumeMounts   = "volume-mounts"
	DeviceListStrategyCDIAnnotations = "cdi-annotations"
	DeviceListStrategyCDICRI         = "cdi-cri"

	DeviceIDStrategyUUID  = "uuid"
	DeviceIDStrategyIndex = "index"

	AllocationPolicyDistributed = "distributed"
	AllocationPolicyPacked      = "packed"

	ResourceNamePrefix              = "nvidia.com"
	DefaultSharedResourceNameSuffix = ".shared"
	MaxResourceNameLength           = 63

	DefaultCDIAnnotationPrefix = "cdi.k8s.io/"
)

// Defaults of the stand-in's own settings.
const (
	DefaultDeviceDir     = "/var/lib/gpu-share-standin/dev"
	DefaultLibDir        = "/var/lib/gpu-share-standin/lib"
	DefaultDriverVersion = "550.54.15"
	DefaultProduct       = "NVIDIA A100-SXM4-80GB"
	DefaultCC            = "8.0"
	// NVMLLogContainerPath is where the CDI specs mount Standin.NVMLLogDir, and what they set
	// GPU_SHARE_STANDIN_NVML_LOG to.
	NVMLLogContainerPath = "/run/gpu-share-standin/nvml"
)

// Config is the stand-in's configuration: NVIDIA's own config file (version, flags, sharing,
// as api/config/v1/config.go's Config) plus the `standin` section describing the node's GPUs.
type Config struct {
	Version string  `json:"version"`
	Flags   Flags   `json:"flags"`
	Sharing Sharing `json:"sharing"`
	Standin Standin `json:"standin"`
}

// Flags are the subset of api/config/v1/flags.go's CommandLineFlags that change what the
// plugin advertises or answers. Other NVIDIA flags in the file are ignored.
type Flags struct {
	MigStrategy    string      `json:"migStrategy"`
	MpsRoot        string      `json:"mpsRoot"`
	GDRCopyEnabled bool        `json:"gdrcopyEnabled"`
	GDSEnabled     bool        `json:"gdsEnabled"`
	MOFEDEnabled   bool        `json:"mofedEnabled"`
	Plugin         PluginFlags `json:"plugin"`
}

// PluginFlags mirrors api/config/v1/flags.go's PluginCommandLineFlags.
type PluginFlags struct {
	PassDeviceSpecs               bool       `json:"passDeviceSpecs"`
	DeviceListStrategy            StringList `json:"deviceListStrategy"`
	DeviceIDStrategy              string     `json:"deviceIDStrategy"`
	CDIAnnotationPrefix           string     `json:"cdiAnnotationPrefix"`
	SharedDevicesAllocationPolicy string     `json:"sharedDevicesAllocationPolicy"`
}

// StringList takes a single string or a list, as api/config/v1/flags.go's
// deviceListStrategyFlag.UnmarshalJSON does.
type StringList []string

// UnmarshalJSON accepts "a" or ["a", "b"].
func (s *StringList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("invalid deviceListStrategy: %s", string(b))
	}
	*s = many
	return nil
}

// Sharing mirrors api/config/v1/sharing.go's Sharing.
type Sharing struct {
	TimeSlicing *ReplicatedResources `json:"timeSlicing,omitempty"`
	MPS         *ReplicatedResources `json:"mps,omitempty"`
}

// ReplicatedResources mirrors api/config/v1/replicas.go's ReplicatedResources.
type ReplicatedResources struct {
	RenameByDefault            bool                 `json:"renameByDefault"`
	FailRequestsGreaterThanOne *bool                `json:"failRequestsGreaterThanOne,omitempty"`
	Resources                  []ReplicatedResource `json:"resources"`
}

// ReplicatedResource mirrors api/config/v1/replicas.go's ReplicatedResource. Devices is kept
// raw: NVIDIA's plugin replaces any value by "all" (DisableResourceNamingInConfig), and so
// does the stand-in.
type ReplicatedResource struct {
	Name     string          `json:"name"`
	Rename   string          `json:"rename,omitempty"`
	Devices  json.RawMessage `json:"devices,omitempty"`
	Replicas int             `json:"replicas"`
}

// SharingStrategy is the active sharing strategy.
type SharingStrategy string

// The sharing strategies of api/config/v1/sharing.go.
const (
	SharingStrategyNone        = SharingStrategy("none")
	SharingStrategyTimeSlicing = SharingStrategy("time-slicing")
	SharingStrategyMPS         = SharingStrategy("mps")
)

// Standin describes the node's stand-in GPUs and where their stand-in files live on the host.
type Standin struct {
	// DeviceDir holds the stand-in device nodes: nvidia<minor>, nvidiactl, nvidia-uvm,
	// nvidia-uvm-tools and nvidia-caps/nvidia-cap<n>, each a char device 1:3.
	DeviceDir string `json:"deviceDir"`
	// LibDir holds the stand-in libnvidia-ml.so.1 and libnvidia-ml.so.<driverVersion>.
	LibDir string `json:"libDir"`
	// NVMLLogDir, when set, is mounted into containers with the GPUs at NVMLLogContainerPath
	// and named there by GPU_SHARE_STANDIN_NVML_LOG.
	NVMLLogDir string `json:"nvmlLogDir,omitempty"`
	// BinDir, when set, holds the stand-in driver binaries (nvidia-cuda-mps-control, built
	// from cmd/nvidia-cuda-mps-control), which the nvidia-ctk form's spec mounts where NVIDIA's
	// mounts the driver's.
	BinDir        string `json:"binDir,omitempty"`
	DriverVersion string `json:"driverVersion"`
	GPUs          []GPU  `json:"gpus"`
}

// GPU is one stand-in GPU.
type GPU struct {
	Index int `json:"index"`
	// Minor is the device node's minor number (/dev/nvidia<minor>); the index when unset.
	Minor             *int   `json:"minor,omitempty"`
	UUID              string `json:"uuid"`
	Product           string `json:"product"`
	MemoryMiB         uint64 `json:"memoryMiB"`
	ComputeCapability string `json:"computeCapability,omitempty"`
	NUMANode          *int   `json:"numaNode,omitempty"`
	// MigEnabled defaults to whether MIG lists any device.
	MigEnabled *bool       `json:"migEnabled,omitempty"`
	MIG        []MIGDevice `json:"mig,omitempty"`
}

// MIGDevice is one MIG device of a stand-in GPU; its index on the GPU is its place in the list.
type MIGDevice struct {
	Profile         string `json:"profile"`
	UUID            string `json:"uuid"`
	GPUInstance     int    `json:"gpuInstance"`
	ComputeInstance int    `json:"computeInstance"`
	MemoryMiB       uint64 `json:"memoryMiB,omitempty"`
}

// MinorNumber is the GPU's device node minor number.
func (g *GPU) MinorNumber() int {
	if g.Minor != nil {
		return *g.Minor
	}
	return g.Index
}

// IsMigEnabled says whether the GPU is in MIG mode.
func (g *GPU) IsMigEnabled() bool {
	if g.MigEnabled != nil {
		return *g.MigEnabled
	}
	return len(g.MIG) > 0
}

var (
	gpuUUID    = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	migUUID    = regexp.MustCompile(`^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	migProfile = regexp.MustCompile(`^(?:([0-9]+)c\.)?([0-9]+)g\.([0-9]+)gb(\+[a-z0-9.+]+)?$`)
	dnsLabel   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// LoadConfig reads the configuration file (JSON, or YAML as NVIDIA's config files are).
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return ParseConfig(b)
}

// ParseConfig parses, defaults and validates a configuration.
func ParseConfig(b []byte) (*Config, error) {
	var c Config
	if err := yaml.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("parsing config: %w", err)
	}
	if err := c.normalize(); err != nil {
		return nil, err
	}
	return &c, nil
}

// normalize applies NVIDIA's defaults and checks, then the stand-in's own.
func (c *Config) normalize() error {
	// As api/config/v1/config.go's parseConfigFrom.
	if c.Version == "" {
		c.Version = "v1"
	}
	if c.Version != "v1" {
		return fmt.Errorf("unknown version: %v", c.Version)
	}
	// The flag defaults of cmd/nvidia-device-plugin/main.go.
	f := &c.Flags
	if f.MigStrategy == "" {
		f.MigStrategy = MigStrategyNone
	}
	if len(f.Plugin.DeviceListStrategy) == 0 {
		f.Plugin.DeviceListStrategy = StringList{DeviceListStrategyEnvVar}
	}
	if f.Plugin.DeviceIDStrategy == "" {
		f.Plugin.DeviceIDStrategy = DeviceIDStrategyUUID
	}
	if f.Plugin.CDIAnnotationPrefix == "" {
		f.Plugin.CDIAnnotationPrefix = DefaultCDIAnnotationPrefix
	}
	if f.Plugin.SharedDevicesAllocationPolicy == "" {
		f.Plugin.SharedDevicesAllocationPolicy = AllocationPolicyDistributed
	}
	if err := c.normalizeSharing(); err != nil {
		return err
	}
	if err := c.validateFlags(); err != nil {
		return err
	}
	return c.normalizeStandin()
}

// normalizeSharing applies replicas.go's UnmarshalJSON checks, config.go's NewConfig MPS
// default and DisableResourceNamingInConfig.
func (c *Config) normalizeSharing() error {
	for _, s := range []struct {
		id string
		rr *ReplicatedResources
	}{{"timeSlicing", c.Sharing.TimeSlicing}, {"mps", c.Sharing.MPS}} {
		if s.rr == nil {
			continue
		}
		if len(s.rr.Resources) == 0 {
			return fmt.Errorf("sharing.%s: no resources specified", s.id)
		}
		for i := range s.rr.Resources {
			r := &s.rr.Resources[i]
			name, err := NewResourceName(r.Name)
			if err != nil {
				return fmt.Errorf("sharing.%s: %w", s.id, err)
			}
			r.Name = name
			if r.Replicas < 2 {
				return fmt.Errorf("sharing.%s: number of replicas must be >= 2", s.id)
			}
			// DisableResourceNamingInConfig: the rename is the default one or none, and
			// every device of the resource is replicated.
			r.Rename = ""
			if s.rr.RenameByDefault {
				r.Rename = r.Name + DefaultSharedResourceNameSuffix
			}
			r.Devices = json.RawMessage(`"all"`)
		}
	}
	if c.Sharing.MPS != nil && c.Sharing.MPS.FailRequestsGreaterThanOne == nil {
		t := true
		c.Sharing.MPS.FailRequestsGreaterThanOne = &t
	}
	return nil
}

// validateFlags follows cmd/nvidia-device-plugin/main.go's validateFlags.
func (c *Config) validateFlags() error {
	f := &c.Flags
	for _, s := range f.Plugin.DeviceListStrategy {
		switch s {
		case DeviceListStrategyEnvVar, DeviceListStrategyVolumeMounts, DeviceListStrategyCDIAnnotations, DeviceListStrategyCDICRI:
		default:
			return fmt.Errorf("invalid --device-list-strategy option: invalid strategy: %v", s)
		}
	}
	if f.Plugin.DeviceIDStrategy != DeviceIDStrategyUUID && f.Plugin.DeviceIDStrategy != DeviceIDStrategyIndex {
		return fmt.Errorf("invalid --device-id-strategy option: %v", f.Plugin.DeviceIDStrategy)
	}
	switch f.Plugin.SharedDevicesAllocationPolicy {
	case AllocationPolicyDistributed, AllocationPolicyPacked:
	default:
		return fmt.Errorf("invalid --shared-devices-allocation-policy option: %s", f.Plugin.SharedDevicesAllocationPolicy)
	}
	if c.SharingStrategy() == SharingStrategyMPS {
		if f.MigStrategy == MigStrategyMixed {
			return fmt.Errorf("using --mig-strategy=mixed is not supported with MPS")
		}
		if f.MpsRoot == "" {
			return fmt.Errorf("using MPS requires --mps-root to be specified")
		}
	}
	switch f.MigStrategy {
	case MigStrategyNone, MigStrategySingle, MigStrategyMixed:
	default:
		return fmt.Errorf("unknown MIG strategy: %v", f.MigStrategy)
	}
	return nil
}

func (c *Config) normalizeStandin() error {
	s := &c.Standin
	if s.DeviceDir == "" {
		s.DeviceDir = DefaultDeviceDir
	}
	if s.LibDir == "" {
		s.LibDir = DefaultLibDir
	}
	if s.DriverVersion == "" {
		s.DriverVersion = DefaultDriverVersion
	}
	if len(s.GPUs) == 0 {
		return fmt.Errorf("standin.gpus: no GPUs")
	}
	sort.SliceStable(s.GPUs, func(i, j int) bool { return s.GPUs[i].Index < s.GPUs[j].Index })
	uuids := map[string]bool{}
	minors := map[int]bool{}
	for i := range s.GPUs {
		g := &s.GPUs[i]
		if g.Index != i {
			return fmt.Errorf("standin.gpus: indexes must be 0..%d, each once (found %d at place %d)", len(s.GPUs)-1, g.Index, i)
		}
		if !gpuUUID.MatchString(g.UUID) {
			return fmt.Errorf("standin.gpus[%d]: UUID %q is not of the form GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lower-case hex)", i, g.UUID)
		}
		if uuids[g.UUID] {
			return fmt.Errorf("standin.gpus[%d]: UUID %s used twice", i, g.UUID)
		}
		uuids[g.UUID] = true
		if m := g.MinorNumber(); m < 0 || m > 254 || minors[m] {
			return fmt.Errorf("standin.gpus[%d]: minor %d is out of range or used twice", i, m)
		}
		minors[g.MinorNumber()] = true
		if g.Product == "" {
			g.Product = DefaultProduct
		}
		if g.ComputeCapability == "" {
			g.ComputeCapability = DefaultCC
		}
		gis := map[[2]int]bool{}
		for j := range g.MIG {
			m := &g.MIG[j]
			if !migProfile.MatchString(m.Profile) {
				return fmt.Errorf("standin.gpus[%d].mig[%d]: profile %q is not of the form 1g.10gb, 1c.2g.20gb or 1g.10gb+me", i, j, m.Profile)
			}
			if !migUUID.MatchString(m.UUID) {
				return fmt.Errorf("standin.gpus[%d].mig[%d]: UUID %q is not of the form MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lower-case hex)", i, j, m.UUID)
			}
			if uuids[m.UUID] {
				return fmt.Errorf("standin.gpus[%d].mig[%d]: UUID %s used twice", i, j, m.UUID)
			}
			uuids[m.UUID] = true
			if m.GPUInstance < 0 || m.GPUInstance > 14 || m.ComputeInstance < 0 || m.ComputeInstance > 7 {
				return fmt.Errorf("standin.gpus[%d].mig[%d]: gpuInstance must be 0..14 and computeInstance 0..7", i, j)
			}
			key := [2]int{m.GPUInstance, m.ComputeInstance}
			if gis[key] {
				return fmt.Errorf("standin.gpus[%d].mig[%d]: gpu instance %d / compute instance %d used twice", i, j, m.GPUInstance, m.ComputeInstance)
			}
			gis[key] = true
		}
		if len(g.MIG) > 0 && !g.IsMigEnabled() {
			return fmt.Errorf("standin.gpus[%d]: MIG devices listed but migEnabled is false", i)
		}
	}
	return nil
}

// SharingStrategy is the active sharing strategy, as api/config/v1/sharing.go's
// Sharing.SharingStrategy: MPS wins over time-slicing.
func (c *Config) SharingStrategy() SharingStrategy {
	if c.Sharing.MPS != nil && c.Sharing.MPS.isReplicated() {
		return SharingStrategyMPS
	}
	if c.Sharing.TimeSlicing != nil && c.Sharing.TimeSlicing.isReplicated() {
		return SharingStrategyTimeSlicing
	}
	return SharingStrategyNone
}

// ReplicatedResources are the resources of the active sharing strategy, as
// api/config/v1/sharing.go's Sharing.ReplicatedResources.
func (c *Config) ReplicatedResources() *ReplicatedResources {
	if c.Sharing.MPS != nil {
		return c.Sharing.MPS
	}
	if c.Sharing.TimeSlicing != nil {
		return c.Sharing.TimeSlicing
	}
	return &ReplicatedResources{}
}

func (rrs *ReplicatedResources) isReplicated() bool {
	for _, r := range rrs.Resources {
		if r.Replicas > 1 {
			return true
		}
	}
	return false
}

// AnyCDIEnabled says whether a CDI device-list strategy is on (api/config/v1/strategy.go).
func (c *Config) AnyCDIEnabled() bool {
	return c.strategy(DeviceListStrategyCDIAnnotations) || c.strategy(DeviceListStrategyCDICRI)
}

// AllCDIEnabled says whether every device-list strategy on is a CDI one
// (api/config/v1/strategy.go).
func (c *Config) AllCDIEnabled() bool {
	for _, s := range c.Flags.Plugin.DeviceListStrategy {
		if !strings.HasPrefix(s, "cdi-") {
			return false
		}
	}
	return true
}

func (c *Config) strategy(name string) bool {
	for _, s := range c.Flags.Plugin.DeviceListStrategy {
		if s == name {
			return true
		}
	}
	return false
}

// NewResourceName prefixes nvidia.com/ and checks the name, as api/config/v1/resources.go's
// NewResourceName.
func NewResourceName(n string) (string, error) {
	if !strings.HasPrefix(n, ResourceNamePrefix+"/") {
		n = ResourceNamePrefix + "/" + n
	}
	if len(n) > MaxResourceNameLength {
		return "", fmt.Errorf("fully-qualified resource name must be %v characters or less: %v", MaxResourceNameLength, n)
	}
	if _, name := splitResource(n); !dnsLabel.MatchString(name) {
		return "", fmt.Errorf("incorrect format for resource name '%v'", n)
	}
	return n, nil
}

func splitResource(n string) (string, string) {
	prefix, name, ok := strings.Cut(n, "/")
	if !ok {
		return "", n
	}
	return prefix, name
}
