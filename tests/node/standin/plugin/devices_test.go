package plugin

import (
	"testing"
)

func TestWholeGPUs(t *testing.T) {
	n := mustNode(t, `{`+twoGPUs+`}`)
	wantEqual(t, "resources", advertised(n), map[string][]string{"nvidia.com/gpu": {u0, u1}})
	d := n.Resource("nvidia.com/gpu").Get(u1)
	wantEqual(t, "index", d.Index, "1")
	wantEqual(t, "paths", d.Paths, []string{"/dev/nvidia1"})
	wantEqual(t, "memory", d.TotalMemory, uint64(81920)<<20)
}

func TestMinorDiffersFromIndex(t *testing.T) {
	n := mustNode(t, `{"standin": {"gpus": [{"index": 0, "minor": 4, "uuid": "`+u0+`"}]}}`)
	wantEqual(t, "paths", n.Resource("nvidia.com/gpu").Get(u0).Paths, []string{"/dev/nvidia4"})
}

func TestTimeSlicedReplicas(t *testing.T) {
	n := mustNode(t, `{"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}, `+twoGPUs+`}`)
	wantEqual(t, "resources", advertised(n), map[string][]string{"nvidia.com/gpu": concat(replicasOf(u0, 3), replicasOf(u1, 3))})
	d := n.Resource("nvidia.com/gpu").Get(u1 + "::2")
	wantEqual(t, "replica's GPU", []any{d.UUID(), d.Index, d.Replicas, d.Paths}, []any{u1, "1", 3, []string{"/dev/nvidia1"}})
	if n.Config.SharingStrategy() != SharingStrategyTimeSlicing {
		t.Fatalf("strategy %v", n.Config.SharingStrategy())
	}
}

func TestTimeSlicedRenameByDefault(t *testing.T) {
	// The short name "gpu" is prefixed with nvidia.com/, as NewResourceName does.
	n := mustNode(t, `{"sharing": {"timeSlicing": {"renameByDefault": true, "resources": [{"name": "gpu", "replicas": 2}]}}, `+twoGPUs+`}`)
	wantEqual(t, "resources", advertised(n), map[string][]string{"nvidia.com/gpu.shared": concat(replicasOf(u0, 2), replicasOf(u1, 2))})
}

func TestCustomRenameIsIgnoredAsNvidiaDoes(t *testing.T) {
	n := mustNode(t, `{"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "rename": "nvidia.com/other", "devices": [0], "replicas": 2}]}}, `+twoGPUs+`}`)
	wantEqual(t, "resources", advertised(n), map[string][]string{"nvidia.com/gpu": concat(replicasOf(u0, 2), replicasOf(u1, 2))})
}

func TestMPSReplicas(t *testing.T) {
	n := mustNode(t, `{"flags": {"mpsRoot": "/run/nvidia/mps"}, "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}, `+twoGPUs+`}`)
	wantEqual(t, "resources", advertised(n), map[string][]string{"nvidia.com/gpu": concat(replicasOf(u0, 4), replicasOf(u1, 4))})
	if n.Config.SharingStrategy() != SharingStrategyMPS {
		t.Fatalf("strategy %v", n.Config.SharingStrategy())
	}
	if f := n.Config.ReplicatedResources().FailRequestsGreaterThanOne; f == nil || !*f {
		t.Fatalf("MPS must default failRequestsGreaterThanOne to true")
	}
	wantEqual(t, "daemon commands", MPSDaemonCommands(n.Resources[0]), []string{
		"set_default_device_pinned_mem_limit 0 20480M",
		"set_default_device_pinned_mem_limit 1 20480M",
		"set_default_active_thread_percentage 25",
	})
}

func TestMPSRenameByDefault(t *testing.T) {
	n := mustNode(t, `{"flags": {"mpsRoot": "/m"}, "sharing": {"mps": {"renameByDefault": true, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}, `+twoGPUs+`}`)
	wantEqual(t, "resources", advertised(n), map[string][]string{"nvidia.com/gpu.shared": concat(replicasOf(u0, 2), replicasOf(u1, 2))})
}

func TestMPSWinsOverTimeSlicing(t *testing.T) {
	n := mustNode(t, `{"flags": {"mpsRoot": "/m"}, "sharing": {
		"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 8}]},
		"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}, `+twoGPUs+`}`)
	wantEqual(t, "resources", advertised(n), map[string][]string{"nvidia.com/gpu": concat(replicasOf(u0, 2), replicasOf(u1, 2))})
}

func TestMIGMixed(t *testing.T) {
	n := mustNode(t, `{"flags": {"migStrategy": "mixed"}, `+migGPU0+`}`)
	wantEqual(t, "resources", advertised(n), map[string][]string{
		"nvidia.com/gpu":         {u1},
		"nvidia.com/mig-1g.10gb": {m0, m1},
		"nvidia.com/mig-2g.20gb": {m2},
	})
	d := n.Resource("nvidia.com/mig-1g.10gb").Get(m1)
	wantEqual(t, "index", d.Index, "0:1")
	wantEqual(t, "paths", d.Paths, []string{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap93", "/dev/nvidia-caps/nvidia-cap94"})
	wantEqual(t, "memory", d.TotalMemory, uint64(10240)<<20)
}

func TestMIGMixedProfileNames(t *testing.T) {
	wantEqual(t, "names", []string{
		MigResourceName("1g.10gb"), MigResourceName("1g.10gb+me"), MigResourceName("3g.40gb"),
		MigResourceName("1c.2g.20gb"), MigResourceName("2c.2g.20gb"),
	}, []string{"nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.me", "nvidia.com/mig-3g.40gb", "", "nvidia.com/mig-2g.20gb"})
	_, err := NewNode(mustConfig(t, `{"flags": {"migStrategy": "mixed"}, "standin": {"gpus": [{"index": 0, "uuid": "`+u0+`", "mig": [
		{"profile": "1c.2g.20gb", "uuid": "`+m0+`", "gpuInstance": 1}]}]}}`))
	wantErr(t, err, "MIG profile '1c.2g.20gb' does not match any resource patterns")
}

func TestMIGMixedTimeSliced(t *testing.T) {
	n := mustNode(t, `{"flags": {"migStrategy": "mixed"}, "sharing": {"timeSlicing": {"resources": [{"name": "mig-1g.10gb", "replicas": 2}]}}, `+migGPU0+`}`)
	wantEqual(t, "resources", advertised(n), map[string][]string{
		"nvidia.com/gpu":         {u1},
		"nvidia.com/mig-1g.10gb": concat(replicasOf(m0, 2), replicasOf(m1, 2)),
		"nvidia.com/mig-2g.20gb": {m2},
	})
}

const singleMIG = `{"flags": {"migStrategy": "single"}, "standin": {"gpus": [
	{"index": 0, "uuid": "` + u0 + `", "mig": [
		{"profile": "3g.40gb", "uuid": "` + m0 + `", "gpuInstance": 1},
		{"profile": "3g.40gb", "uuid": "` + m1 + `", "gpuInstance": 2}]},
	{"index": 1, "uuid": "` + u1 + `", "mig": [
		{"profile": "3g.40gb", "uuid": "` + m2 + `", "gpuInstance": 1}]}]}}`

func TestMIGSingle(t *testing.T) {
	n := mustNode(t, singleMIG)
	wantEqual(t, "resources", advertised(n), map[string][]string{"nvidia.com/gpu": {m0, m1, m2}})
	wantEqual(t, "index", n.Resource("nvidia.com/gpu").Get(m2).Index, "1:0")
	// GPU 1 (minor 1), GPU instance 1: 3 + 135 + 9.
	wantEqual(t, "paths", n.Resource("nvidia.com/gpu").Get(m2).Paths,
		[]string{"/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap147", "/dev/nvidia-caps/nvidia-cap148"})
}

func TestMIGSingleRejectsWhatNvidiaRejects(t *testing.T) {
	_, err := NewNode(mustConfig(t, `{"flags": {"migStrategy": "single"}, `+migGPU0+`}`))
	wantErr(t, err, "more than one MIG device type present on node")

	_, err = NewNode(mustConfig(t, `{"flags": {"migStrategy": "single"}, "standin": {"gpus": [
		{"index": 0, "uuid": "`+u0+`", "mig": [{"profile": "1g.10gb", "uuid": "`+m0+`", "gpuInstance": 9}]},
		{"index": 1, "uuid": "`+u1+`"}]}}`))
	wantErr(t, err, "all devices on the node must be configured with the same migEnabled value")

	_, err = NewNode(mustConfig(t, `{"flags": {"migStrategy": "single"}, "standin": {"gpus": [
		{"index": 0, "uuid": "`+u0+`", "migEnabled": true}]}}`))
	wantErr(t, err, "device 0 has no MIG devices configured")
}

func TestMIGStrategyNoneAdvertisesWholeGPUs(t *testing.T) {
	n := mustNode(t, `{`+migGPU0+`}`)
	wantEqual(t, "resources", advertised(n), map[string][]string{"nvidia.com/gpu": {u0, u1}})
}

func TestMPSRejectsWhatNvidiaRejects(t *testing.T) {
	mps := `"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}`
	_, err := ParseConfig([]byte(`{` + mps + `, ` + twoGPUs + `}`))
	wantErr(t, err, "using MPS requires --mps-root to be specified")
	_, err = ParseConfig([]byte(`{"flags": {"mpsRoot": "/m", "migStrategy": "mixed"}, ` + mps + `, ` + twoGPUs + `}`))
	wantErr(t, err, "using --mig-strategy=mixed is not supported with MPS")
	_, err = NewNode(mustConfig(t, `{"flags": {"mpsRoot": "/m", "migStrategy": "single"}, "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}, "standin": {"gpus": [
		{"index": 0, "uuid": "`+u0+`", "mig": [{"profile": "1g.10gb", "uuid": "`+m0+`", "gpuInstance": 9}]}]}}`))
	wantErr(t, err, "sharing using MPS is not supported for MIG devices")
	_, err = NewNode(mustConfig(t, `{"flags": {"mpsRoot": "/m"}, "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 49}]}}, `+twoGPUs+`}`))
	wantErr(t, err, "maximum allowed replicas exceeded: 49 > 48")
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ body, err string }{
		{`{"standin": {"gpus": [{"index": 0, "uuid": "GPU-123"}]}}`, "is not of the form GPU-"},
		{`{"standin": {"gpus": [{"index": 1, "uuid": "` + u0 + `"}]}}`, "indexes must be 0..0"},
		{`{"standin": {"gpus": [{"index": 0, "uuid": "` + u0 + `"}, {"index": 1, "uuid": "` + u0 + `"}]}}`, "used twice"},
		{`{"standin": {"gpus": []}}`, "no GPUs"},
		{`{"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 1}]}}, ` + twoGPUs + `}`, "number of replicas must be >= 2"},
		{`{"sharing": {"timeSlicing": {"resources": []}}, ` + twoGPUs + `}`, "no resources specified"},
		{`{"flags": {"migStrategy": "some"}, ` + twoGPUs + `}`, "unknown MIG strategy: some"},
		{`{"flags": {"plugin": {"deviceListStrategy": "cdi"}}, ` + twoGPUs + `}`, "invalid strategy: cdi"},
		{`{"flags": {"plugin": {"deviceIDStrategy": "serial"}}, ` + twoGPUs + `}`, "invalid --device-id-strategy option: serial"},
		{`{"version": "v2", ` + twoGPUs + `}`, "unknown version: v2"},
		{`{"standin": {"gpus": [{"index": 0, "uuid": "` + u0 + `", "mig": [{"profile": "big", "uuid": "` + m0 + `"}]}]}}`, "profile \"big\""},
	} {
		_, err := ParseConfig([]byte(tc.body))
		wantErr(t, err, tc.err)
	}
}

func TestNvidiaYAMLConfig(t *testing.T) {
	c := mustConfig(t, `
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  nvidiaDriverRoot: /
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: cdi-cri
    deviceIDStrategy: index
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 2
standin:
  gpus:
  - {index: 0, uuid: `+u0+`}
`)
	wantEqual(t, "flags", []any{[]string(c.Flags.Plugin.DeviceListStrategy), c.Flags.Plugin.DeviceIDStrategy, c.SharingStrategy()},
		[]any{[]string{"cdi-cri"}, "index", SharingStrategyTimeSlicing})
}

func TestDefaults(t *testing.T) {
	c := mustConfig(t, `{"standin": {"gpus": [{"index": 0, "uuid": "`+u0+`"}]}}`)
	wantEqual(t, "defaults", []any{c.Flags.MigStrategy, []string(c.Flags.Plugin.DeviceListStrategy), c.Flags.Plugin.DeviceIDStrategy,
		c.Flags.Plugin.CDIAnnotationPrefix, c.Standin.DeviceDir, c.Standin.LibDir, c.Standin.DriverVersion, c.Standin.GPUs[0].Product},
		[]any{"none", []string{"envvar"}, "uuid", "cdi.k8s.io/", DefaultDeviceDir, DefaultLibDir, DefaultDriverVersion, DefaultProduct})
}
