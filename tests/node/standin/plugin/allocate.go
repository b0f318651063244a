package plugin

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Names NVIDIA's plugin uses in its answers.
const (
	// CDIVendor is the vendor of the device plugin's CDI spec (cmd/nvidia-device-plugin/
	// plugin-manager.go's GetPlugins: cdi.WithVendor).
	CDIVendor = "k8s.device-plugin.nvidia.com"
	// CDIClass is the class of its GPUs (internal/plugin/server.go's updateResponseForCDI).
	CDIClass = "gpu"
	// cdiAnnotationPlugin is the plugin name in the annotation key
	// (internal/plugin/server.go's getCDIDeviceAnnotations).
	cdiAnnotationPlugin = "nvidia-device-plugin"

	// The constants of internal/plugin/server.go.
	deviceListEnvVar                          = "NVIDIA_VISIBLE_DEVICES"
	deviceListAsVolumeMountsHostPath          = "/dev/null"
	deviceListAsVolumeMountsContainerPathRoot = "/var/run/nvidia-container-devices"

	// mpsContainerRoot is where the MPS root is in the containers
	// (cmd/mps-control-daemon/mps/root.go's ContainerRoot).
	mpsContainerRoot = "/mps"
)

var errInvalidRequest = errors.New("invalid request")

// Node is the stand-in plugin's view of the node: its configuration and the resources it
// advertises.
type Node struct {
	Config    *Config
	Resources []*Resource
	// NewID makes the ID in the CDI annotation key; a random UUID, as
	// internal/plugin/server.go's getAllocateResponse does. Tests may replace it.
	NewID func() string
}

// NewNode builds the node's resources from the configuration.
func NewNode(c *Config) (*Node, error) {
	rs, err := BuildResources(c)
	if err != nil {
		return nil, err
	}
	return &Node{Config: c, Resources: rs, NewID: randomUUID}, nil
}

// Resource is the advertised resource with the name, or nil.
func (n *Node) Resource(name string) *Resource {
	for _, r := range n.Resources {
		if r.Name == name {
			return r
		}
	}
	return nil
}

func randomUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// ValidateRequest follows internal/rm/rm.go's resourceManager.ValidateRequest: every ID must
// be advertised, and a request for more than one replica fails where
// failRequestsGreaterThanOne is set (the default under MPS).
func (n *Node) ValidateRequest(r *Resource, ids []string) error {
	anyReplica := false
	for _, id := range ids {
		if r.Get(id) == nil {
			return fmt.Errorf("%w: unknown device: %s", errInvalidRequest, id)
		}
		anyReplica = anyReplica || hasAnnotation(id)
	}
	fail := n.Config.ReplicatedResources().FailRequestsGreaterThanOne
	if n.Config.SharingStrategy() != SharingStrategyNone && anyReplica && len(ids) > 1 && fail != nil && *fail {
		return fmt.Errorf("%w: maximum request size for shared resources is 1; found %d", errInvalidRequest, len(ids))
	}
	return nil
}

// Allocate answers one container's request as internal/plugin/server.go's Allocate does.
func (n *Node) Allocate(resource string, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	r := n.Resource(resource)
	if r == nil {
		return nil, fmt.Errorf("unknown resource %q", resource)
	}
	if err := n.ValidateRequest(r, ids); err != nil {
		return nil, fmt.Errorf("invalid allocation request for %q: %w", resource, err)
	}
	resp, err := n.allocateResponse(r, ids)
	if err != nil {
		return nil, fmt.Errorf("failed to get allocate response: %v", err)
	}
	return resp, nil
}

// allocateResponse follows internal/plugin/server.go's getAllocateResponse.
func (n *Node) allocateResponse(r *Resource, requestIDs []string) (*pluginapi.ContainerAllocateResponse, error) {
	c := n.Config
	deviceIDs := n.uniqueDeviceIDs(r, requestIDs)
	response := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}

	if c.AnyCDIEnabled() {
		if err := n.updateResponseForCDI(response, n.NewID(), deviceIDs); err != nil {
			return nil, fmt.Errorf("failed to get allocate response for CDI: %v", err)
		}
	}
	if c.SharingStrategy() == SharingStrategyMPS {
		updateResponseForMPS(response, c.Flags.MpsRoot, r.Name)
	}
	if c.Flags.GDRCopyEnabled {
		response.Envs["NVIDIA_GDRCOPY"] = "enabled"
	}
	if c.Flags.GDSEnabled {
		response.Envs["NVIDIA_GDS"] = "enabled"
	}
	if c.Flags.MOFEDEnabled {
		response.Envs["NVIDIA_MOFED"] = "enabled"
	}
	// The rest only where a non-CDI strategy is on.
	if c.AllCDIEnabled() {
		return response, nil
	}
	if c.strategy(DeviceListStrategyEnvVar) {
		// updateResponseForDeviceListEnvVar.
		response.Envs[deviceListEnvVar] = strings.Join(deviceIDs, ",")
	}
	if c.strategy(DeviceListStrategyVolumeMounts) {
		// updateResponseForDeviceMounts.
		response.Envs[deviceListEnvVar] = deviceListAsVolumeMountsContainerPathRoot
		for _, id := range deviceIDs {
			response.Mounts = append(response.Mounts, &pluginapi.Mount{
				HostPath:      deviceListAsVolumeMountsHostPath,
				ContainerPath: filepath.Join(deviceListAsVolumeMountsContainerPathRoot, id),
			})
		}
	}
	if c.Flags.Plugin.PassDeviceSpecs {
		response.Devices = append(response.Devices, n.apiDeviceSpecs(r, requestIDs)...)
	}
	return response, nil
}

// uniqueDeviceIDs follows internal/plugin/server.go's uniqueDeviceIDsFromAnnotatedDeviceIDs:
// the UUIDs (replica annotations dropped) or the indexes, each once. NVIDIA's plugin gives
// indexes in Go map order; the stand-in keeps the request's order.
func (n *Node) uniqueDeviceIDs(r *Resource, ids []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, id := range ids {
		v := AnnotatedID(id)
		if n.Config.Flags.Plugin.DeviceIDStrategy == DeviceIDStrategyIndex {
			d := r.Get(id)
			if d == nil {
				continue
			}
			v = d.Index
		}
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// QualifiedName is a CDI device name, vendor/class=name (the CDI parser's QualifiedName).
func QualifiedName(vendor, class, name string) string {
	return vendor + "/" + class + "=" + name
}

// updateResponseForCDI follows internal/plugin/server.go's updateResponseForCDI and
// getCDIDeviceAnnotations: the devices k8s.device-plugin.nvidia.com/gpu=<id> as the annotation
// <prefix>nvidia-device-plugin_<responseID> (the CDI package's UpdateAnnotations) and/or as
// CDIDevices.
func (n *Node) updateResponseForCDI(response *pluginapi.ContainerAllocateResponse, responseID string, deviceIDs []string) error {
	var devices []string
	for _, id := range deviceIDs {
		devices = append(devices, QualifiedName(CDIVendor, CDIClass, id))
	}
	if len(devices) == 0 {
		return nil
	}
	c := n.Config
	if c.strategy(DeviceListStrategyCDIAnnotations) {
		key, err := cdiAnnotationKey(cdiAnnotationPlugin, responseID)
		if err != nil {
			return fmt.Errorf("failed to add CDI annotations: CDI annotation failed: %v", err)
		}
		key = c.Flags.Plugin.CDIAnnotationPrefix + strings.TrimPrefix(key, DefaultCDIAnnotationPrefix)
		response.Annotations = map[string]string{key: strings.Join(devices, ",")}
	}
	if c.strategy(DeviceListStrategyCDICRI) {
		for _, d := range devices {
			response.CdiDevices = append(response.CdiDevices, &pluginapi.CDIDevice{Name: d})
		}
	}
	return nil
}

// cdiAnnotationKey follows the CDI package's AnnotationKey (pkg/cdi/annotations.go).
func cdiAnnotationKey(pluginName, deviceID string) (string, error) {
	name := pluginName + "_" + strings.ReplaceAll(deviceID, "/", "_")
	if len(name) > 63 {
		return "", fmt.Errorf("invalid plugin+deviceID %q, too long", name)
	}
	for i, ch := range name {
		alnum := ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9'
		inner := i > 0 && i < len(name)-1
		if !alnum && !(inner && (ch == '_' || ch == '-' || ch == '.')) {
			return "", fmt.Errorf("invalid name %q, invalid character '%c'", name, ch)
		}
	}
	return DefaultCDIAnnotationPrefix + name, nil
}

// updateResponseForMPS follows internal/plugin/mps.go's mpsOptions.updateReponse: the
// resource's pipe directory (env and mount) and the MPS daemon's shm as /dev/shm.
func updateResponseForMPS(response *pluginapi.ContainerAllocateResponse, mpsRoot, resource string) {
	pipe := filepath.Join(mpsContainerRoot, resource, "pipe")
	response.Envs["CUDA_MPS_PIPE_DIRECTORY"] = pipe
	response.Mounts = append(response.Mounts,
		&pluginapi.Mount{ContainerPath: pipe, HostPath: filepath.Join(mpsRoot, resource, "pipe")},
		&pluginapi.Mount{ContainerPath: "/dev/shm", HostPath: filepath.Join(mpsRoot, "shm")},
	)
}

// controlDevices are the device nodes NVIDIA's plugin passes, where present, besides each
// GPU's (internal/rm/nvml_manager.go's GetDevicePaths).
var controlDevices = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}

// apiDeviceSpecs follows internal/plugin/server.go's apiDeviceSpecs: the control devices that
// exist, then each requested device's nodes, read-write. The host side is the stand-in device
// directory: /dev/<name> is <deviceDir>/<name>.
func (n *Node) apiDeviceSpecs(r *Resource, ids []string) []*pluginapi.DeviceSpec {
	var paths []string
	paths = append(paths, controlDevices...)
	for _, id := range ids {
		if d := r.Get(id); d != nil {
			paths = append(paths, d.Paths...)
		}
	}
	optional := map[string]bool{}
	for _, p := range controlDevices {
		optional[p] = true
	}
	var specs []*pluginapi.DeviceSpec
	for _, p := range paths {
		host := n.Config.Standin.HostDevicePath(p)
		if optional[p] {
			if _, err := os.Stat(host); err != nil {
				continue
			}
		}
		specs = append(specs, &pluginapi.DeviceSpec{ContainerPath: p, HostPath: host, Permissions: "rw"})
	}
	return specs
}

// HostDevicePath is the stand-in node on the host for the container's /dev/<name>.
func (s *Standin) HostDevicePath(containerPath string) string {
	return filepath.Join(s.DeviceDir, strings.TrimPrefix(containerPath, "/dev/"))
}

// PreferredAllocation follows internal/rm/nvml_manager.go's getPreferredAllocation: for whole
// GPUs without replicas an aligned allocation (NVIDIA asks go-gpuallocator's best-effort
// policy, which weighs NVLink topology; the stand-in GPUs have none, so the stand-in takes
// the required devices, then the available ones by index), otherwise the greedy allocation
// of internal/rm/allocate.go under the configured policy.
func (n *Node) PreferredAllocation(r *Resource, available, required []string, size int) ([]string, error) {
	aligned := true
	for _, d := range r.Devices {
		if d.IsMigDevice() {
			aligned = false
		}
	}
	for _, id := range available {
		if hasAnnotation(id) {
			aligned = false
		}
	}
	if aligned {
		return alignedAlloc(r, available, required, size), nil
	}
	return greedyAlloc(r, available, required, size, n.Config.Flags.Plugin.SharedDevicesAllocationPolicy)
}

func alignedAlloc(r *Resource, available, required []string, size int) []string {
	out := append([]string{}, required...)
	taken := map[string]bool{}
	for _, id := range required {
		taken[id] = true
	}
	var rest []*Device
	for _, id := range available {
		if d := r.Get(id); d != nil && !taken[id] {
			taken[id] = true
			rest = append(rest, d)
		}
	}
	sort.SliceStable(rest, func(i, j int) bool { return rest[i].GPU.Index < rest[j].GPU.Index })
	for _, d := range rest {
		if len(out) >= size {
			break
		}
		out = append(out, d.ID)
	}
	return out
}

type replicaCount struct{ total, available int }

func (rc *replicaCount) allocated() int { return rc.total - rc.available }

// greedyAlloc follows internal/rm/allocate.go's prepareCandidates and greedyAlloc:
// distributed prefers the GPU with the fewest replicas in use, packed the most, ties going
// to the GPU picked least in this allocation.
func greedyAlloc(r *Resource, available, required []string, size int, policy string) ([]string, error) {
	req := map[string]bool{}
	for _, id := range required {
		req[id] = true
	}
	var candidates []string
	seen := map[string]bool{}
	for _, id := range available {
		if r.Get(id) != nil && !req[id] && !seen[id] {
			seen[id] = true
			candidates = append(candidates, id)
		}
	}
	needed := size - len(required)
	if len(candidates) < needed {
		return nil, fmt.Errorf("error getting list of preferred allocation devices: not enough available devices to satisfy allocation")
	}
	replicas := map[string]*replicaCount{}
	for _, id := range candidates {
		u := AnnotatedID(id)
		if replicas[u] == nil {
			replicas[u] = &replicaCount{}
		}
		replicas[u].available++
	}
	for _, d := range r.Devices {
		if rc := replicas[AnnotatedID(d.ID)]; rc != nil {
			rc.total++
		}
	}
	prefer := func(a, b *replicaCount) bool { return a.allocated() < b.allocated() }
	if policy == AllocationPolicyPacked {
		prefer = func(a, b *replicaCount) bool { return a.allocated() > b.allocated() }
	}
	picked := map[string]int{}
	out := append([]string{}, required...)
	for i := 0; i < needed; i++ {
		sort.SliceStable(candidates, func(i, j int) bool {
			a, b := AnnotatedID(candidates[i]), AnnotatedID(candidates[j])
			ra, rb := replicas[a], replicas[b]
			if ra.allocated() != rb.allocated() {
				return prefer(ra, rb)
			}
			return picked[a] < picked[b]
		})
		u := AnnotatedID(candidates[0])
		picked[u]++
		replicas[u].available--
		out = append(out, candidates[0])
		candidates = candidates[1:]
	}
	return out, nil
}
