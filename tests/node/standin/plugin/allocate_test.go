package plugin

import (
	"os"
	"path/filepath"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const annotationKey = "cdi.k8s.io/nvidia-device-plugin_11111111-2222-4333-8444-555555555555"

func allocate(t *testing.T, n *Node, resource string, ids ...string) *pluginapi.ContainerAllocateResponse {
	t.Helper()
	r, err := n.Allocate(resource, ids)
	if err != nil {
		t.Fatalf("Allocate %s %v: %v", resource, ids, err)
	}
	return r
}

func withStrategy(strategy, idStrategy, rest string) string {
	return `{"flags": {"plugin": {"deviceListStrategy": ` + strategy + `, "deviceIDStrategy": "` + idStrategy + `"}}` + rest + `, ` + twoGPUs + `}`
}

func TestAllocateEnvVarUUID(t *testing.T) {
	n := mustNode(t, withStrategy(`"envvar"`, "uuid", ""))
	r := allocate(t, n, "nvidia.com/gpu", u1, u0)
	wantEqual(t, "response", r, &pluginapi.ContainerAllocateResponse{
		Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": u1 + "," + u0},
	})
}

func TestAllocateEnvVarIndex(t *testing.T) {
	n := mustNode(t, withStrategy(`["envvar"]`, "index", ""))
	r := allocate(t, n, "nvidia.com/gpu", u1)
	wantEqual(t, "envs", r.Envs, map[string]string{"NVIDIA_VISIBLE_DEVICES": "1"})
}

func TestAllocateReplicasMapBackToTheGPU(t *testing.T) {
	ts := `, "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}`
	n := mustNode(t, withStrategy(`"envvar"`, "uuid", ts))
	r := allocate(t, n, "nvidia.com/gpu", u0+"::3", u0+"::1", u1+"::0")
	wantEqual(t, "envs", r.Envs, map[string]string{"NVIDIA_VISIBLE_DEVICES": u0 + "," + u1})

	n = mustNode(t, withStrategy(`"envvar"`, "index", ts))
	r = allocate(t, n, "nvidia.com/gpu", u1+"::2")
	wantEqual(t, "envs", r.Envs, map[string]string{"NVIDIA_VISIBLE_DEVICES": "1"})

	_, err := n.Allocate("nvidia.com/gpu", []string{u1})
	wantErr(t, err, "invalid request: unknown device: "+u1)
}

func TestAllocateFailRequestsGreaterThanOne(t *testing.T) {
	n := mustNode(t, withStrategy(`"envvar"`, "uuid", `, "sharing": {"timeSlicing": {"failRequestsGreaterThanOne": true, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}`))
	_, err := n.Allocate("nvidia.com/gpu", []string{u0 + "::0", u1 + "::0"})
	wantErr(t, err, "maximum request size for shared resources is 1; found 2")
	allocate(t, n, "nvidia.com/gpu", u0+"::0")
}

func TestAllocateCDIAnnotations(t *testing.T) {
	n := mustNode(t, withStrategy(`"cdi-annotations"`, "uuid", ""))
	r := allocate(t, n, "nvidia.com/gpu", u1, u0)
	wantEqual(t, "response", r, &pluginapi.ContainerAllocateResponse{
		Envs:        map[string]string{},
		Annotations: map[string]string{annotationKey: "k8s.device-plugin.nvidia.com/gpu=" + u1 + ",k8s.device-plugin.nvidia.com/gpu=" + u0},
	})
}

func TestAllocateCDIAnnotationsCustomPrefix(t *testing.T) {
	n := mustNode(t, `{"flags": {"plugin": {"deviceListStrategy": "cdi-annotations", "cdiAnnotationPrefix": "nvidia.cdi.k8s.io/"}}, `+twoGPUs+`}`)
	r := allocate(t, n, "nvidia.com/gpu", u0)
	wantEqual(t, "annotations", r.Annotations, map[string]string{
		"nvidia.cdi.k8s.io/nvidia-device-plugin_11111111-2222-4333-8444-555555555555": "k8s.device-plugin.nvidia.com/gpu=" + u0,
	})
}

func TestAllocateCDICRI(t *testing.T) {
	n := mustNode(t, withStrategy(`"cdi-cri"`, "uuid", ""))
	r := allocate(t, n, "nvidia.com/gpu", u0)
	wantEqual(t, "response", r, &pluginapi.ContainerAllocateResponse{
		Envs:       map[string]string{},
		CdiDevices: []*pluginapi.CDIDevice{{Name: "k8s.device-plugin.nvidia.com/gpu=" + u0}},
	})

	n = mustNode(t, withStrategy(`"cdi-cri"`, "index", ""))
	r = allocate(t, n, "nvidia.com/gpu", u1)
	wantEqual(t, "cdi devices", r.CdiDevices, []*pluginapi.CDIDevice{{Name: "k8s.device-plugin.nvidia.com/gpu=1"}})
}

func TestAllocateCDICRIMig(t *testing.T) {
	n := mustNode(t, `{"flags": {"migStrategy": "mixed", "plugin": {"deviceListStrategy": "cdi-cri"}}, `+migGPU0+`}`)
	r := allocate(t, n, "nvidia.com/mig-1g.10gb", m1)
	wantEqual(t, "cdi devices", r.CdiDevices, []*pluginapi.CDIDevice{{Name: "k8s.device-plugin.nvidia.com/gpu=" + m1}})

	n = mustNode(t, `{"flags": {"migStrategy": "mixed", "plugin": {"deviceListStrategy": "envvar", "deviceIDStrategy": "index"}}, `+migGPU0+`}`)
	r = allocate(t, n, "nvidia.com/mig-2g.20gb", m2)
	wantEqual(t, "envs", r.Envs, map[string]string{"NVIDIA_VISIBLE_DEVICES": "0:2"})
}

func TestAllocateEnvVarAndCDITogether(t *testing.T) {
	n := mustNode(t, withStrategy(`["envvar", "cdi-annotations", "cdi-cri"]`, "uuid", ""))
	r := allocate(t, n, "nvidia.com/gpu", u0)
	wantEqual(t, "response", r, &pluginapi.ContainerAllocateResponse{
		Envs:        map[string]string{"NVIDIA_VISIBLE_DEVICES": u0},
		Annotations: map[string]string{annotationKey: "k8s.device-plugin.nvidia.com/gpu=" + u0},
		CdiDevices:  []*pluginapi.CDIDevice{{Name: "k8s.device-plugin.nvidia.com/gpu=" + u0}},
	})
}

func TestAllocateVolumeMounts(t *testing.T) {
	n := mustNode(t, withStrategy(`"volume-mounts"`, "uuid", ""))
	r := allocate(t, n, "nvidia.com/gpu", u0, u1)
	wantEqual(t, "response", r, &pluginapi.ContainerAllocateResponse{
		Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
		Mounts: []*pluginapi.Mount{
			{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/" + u0},
			{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/" + u1},
		},
	})
}

func TestAllocateMPS(t *testing.T) {
	n := mustNode(t, `{"flags": {"mpsRoot": "/run/nvidia/mps"}, "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}, `+twoGPUs+`}`)
	r := allocate(t, n, "nvidia.com/gpu", u1+"::2")
	wantEqual(t, "response", r, &pluginapi.ContainerAllocateResponse{
		Envs: map[string]string{
			"CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
			"NVIDIA_VISIBLE_DEVICES":  u1,
		},
		Mounts: []*pluginapi.Mount{
			{ContainerPath: "/mps/nvidia.com/gpu/pipe", HostPath: "/run/nvidia/mps/nvidia.com/gpu/pipe"},
			{ContainerPath: "/dev/shm", HostPath: "/run/nvidia/mps/shm"},
		},
	})
	_, err := n.Allocate("nvidia.com/gpu", []string{u1 + "::2", u1 + "::3"})
	wantErr(t, err, "maximum request size for shared resources is 1; found 2")
}

func TestAllocateMPSRenamedWithCDI(t *testing.T) {
	n := mustNode(t, `{"flags": {"mpsRoot": "/mps-root", "plugin": {"deviceListStrategy": "cdi-cri"}}, "sharing": {"mps": {"renameByDefault": true, "failRequestsGreaterThanOne": false, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}, `+twoGPUs+`}`)
	r := allocate(t, n, "nvidia.com/gpu.shared", u0+"::0", u0+"::1")
	wantEqual(t, "response", r, &pluginapi.ContainerAllocateResponse{
		Envs:       map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu.shared/pipe"},
		CdiDevices: []*pluginapi.CDIDevice{{Name: "k8s.device-plugin.nvidia.com/gpu=" + u0}},
		Mounts: []*pluginapi.Mount{
			{ContainerPath: "/mps/nvidia.com/gpu.shared/pipe", HostPath: "/mps-root/nvidia.com/gpu.shared/pipe"},
			{ContainerPath: "/dev/shm", HostPath: "/mps-root/shm"},
		},
	})
}

func TestAllocateExtraFlagsEnvs(t *testing.T) {
	n := mustNode(t, `{"flags": {"gdrcopyEnabled": true, "gdsEnabled": true, "mofedEnabled": true}, `+twoGPUs+`}`)
	r := allocate(t, n, "nvidia.com/gpu", u0)
	wantEqual(t, "envs", r.Envs, map[string]string{"NVIDIA_VISIBLE_DEVICES": u0, "NVIDIA_GDRCOPY": "enabled", "NVIDIA_GDS": "enabled", "NVIDIA_MOFED": "enabled"})
}

func TestAllocatePassDeviceSpecs(t *testing.T) {
	dir := t.TempDir()
	// Only the control devices that exist are passed.
	if err := os.WriteFile(filepath.Join(dir, "nvidiactl"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	n := mustNode(t, `{"flags": {"plugin": {"passDeviceSpecs": true}}, "standin": {"deviceDir": "`+dir+`", "gpus": [
		{"index": 0, "uuid": "`+u0+`"}, {"index": 1, "minor": 7, "uuid": "`+u1+`"}]}}`)
	r := allocate(t, n, "nvidia.com/gpu", u1)
	wantEqual(t, "devices", r.Devices, []*pluginapi.DeviceSpec{
		{ContainerPath: "/dev/nvidiactl", HostPath: dir + "/nvidiactl", Permissions: "rw"},
		{ContainerPath: "/dev/nvidia7", HostPath: dir + "/nvidia7", Permissions: "rw"},
	})
	wantEqual(t, "envs", r.Envs, map[string]string{"NVIDIA_VISIBLE_DEVICES": u1})
}

func TestPreferredAllocation(t *testing.T) {
	ts := func(policy string) string {
		return `{"flags": {"plugin": {"sharedDevicesAllocationPolicy": "` + policy + `"}}, "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}, ` + twoGPUs + `}`
	}
	n := mustNode(t, ts("distributed"))
	r := n.Resource("nvidia.com/gpu")
	got, err := n.PreferredAllocation(r, r.IDs(), nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "distributed", got, []string{u0 + "::0", u1 + "::0"})
	// With u0::0 taken elsewhere, u1 has fewer replicas in use.
	got, _ = n.PreferredAllocation(r, r.IDs()[1:], nil, 1)
	wantEqual(t, "distributed after one", got, []string{u1 + "::0"})

	n = mustNode(t, ts("packed"))
	r = n.Resource("nvidia.com/gpu")
	got, _ = n.PreferredAllocation(r, r.IDs(), nil, 2)
	wantEqual(t, "packed", got, []string{u0 + "::0", u0 + "::1"})

	_, err = n.PreferredAllocation(r, r.IDs()[:1], nil, 2)
	wantErr(t, err, "not enough available devices")

	n = mustNode(t, `{`+twoGPUs+`}`)
	r = n.Resource("nvidia.com/gpu")
	got, _ = n.PreferredAllocation(r, []string{u1, u0}, []string{u1}, 2)
	wantEqual(t, "whole GPUs", got, []string{u1, u0})
	got, _ = n.PreferredAllocation(r, []string{u1, u0}, nil, 1)
	wantEqual(t, "whole GPUs by index", got, []string{u0})
}

func TestAnnotationKeyRules(t *testing.T) {
	k, err := cdiAnnotationKey("nvidia-device-plugin", "a/b")
	if err != nil || k != "cdi.k8s.io/nvidia-device-plugin_a_b" {
		t.Fatalf("key %q %v", k, err)
	}
	_, err = cdiAnnotationKey("nvidia-device-plugin", "0123456789012345678901234567890123456789012")
	wantErr(t, err, "too long")
	_, err = cdiAnnotationKey("nvidia-device-plugin", "a b")
	wantErr(t, err, "invalid character")
}
