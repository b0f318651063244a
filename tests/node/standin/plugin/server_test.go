package plugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeKubelet is kubelet's registration service on <dir>/kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	regs chan *pluginapi.RegisterRequest
	srv  *grpc.Server
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.regs <- r
	return &pluginapi.Empty{}, nil
}

func startKubelet(t *testing.T, dir string, regs chan *pluginapi.RegisterRequest) *fakeKubelet {
	t.Helper()
	sock := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{regs: regs, srv: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(l) }()
	return k
}

// stop stops kubelet as a restart does: the socket goes away.
func (k *fakeKubelet) stop(dir string) {
	k.srv.Stop()
	_ = os.Remove(filepath.Join(dir, "kubelet.sock"))
}

func waitRegistrations(t *testing.T, regs chan *pluginapi.RegisterRequest, n int) []*pluginapi.RegisterRequest {
	t.Helper()
	var out []*pluginapi.RegisterRequest
	timeout := time.After(20 * time.Second)
	for len(out) < n {
		select {
		case r := <-regs:
			out = append(out, r)
		case <-timeout:
			t.Fatalf("%d registrations of %d within 20s", len(out), n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ResourceName < out[j].ResourceName })
	return out
}

func TestServeRegisterAllocateAndReregister(t *testing.T) {
	dir := t.TempDir()
	sockets := filepath.Join(dir, "dp")
	if err := os.MkdirAll(sockets, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.json")
	body := `{"flags": {"migStrategy": "mixed", "plugin": {"deviceListStrategy": ["envvar", "cdi-cri"]}}, ` + migGPU0 + `}`
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	regs := make(chan *pluginapi.RegisterRequest, 16)
	k := startKubelet(t, sockets, regs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	opts := Options{ConfigPath: cfg, SocketDir: sockets, CDIDir: filepath.Join(dir, "cdi"), NvidiaCTKSpec: filepath.Join(dir, "cdi", "nvidia.yaml"),
		RetryInterval: 200 * time.Millisecond, PollInterval: 50 * time.Millisecond}
	go func() { done <- Run(ctx, opts, nil) }()
	got := waitRegistrations(t, regs, 3)
	var summary [][3]string
	for _, r := range got {
		summary = append(summary, [3]string{r.ResourceName, r.Endpoint, r.Version})
		if !r.Options.GetPreferredAllocationAvailable {
			t.Fatalf("%s: GetPreferredAllocationAvailable not set", r.ResourceName)
		}
	}
	wantEqual(t, "registrations", summary, [][3]string{
		{"nvidia.com/gpu", "nvidia-gpu.sock", "v1beta1"},
		{"nvidia.com/mig-1g.10gb", "nvidia-mig-1g.10gb.sock", "v1beta1"},
		{"nvidia.com/mig-2g.20gb", "nvidia-mig-2g.20gb.sock", "v1beta1"},
	})
	for _, f := range []string{"cdi/k8s.device-plugin.nvidia.com-gpu.json", "cdi/nvidia.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("CDI spec: %v", err)
		}
	}

	// kubelet's side of the conversation with one plugin.
	conn, err := dial(context.Background(), filepath.Join(sockets, "nvidia-mig-1g.10gb.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	stream, err := client.ListAndWatch(cctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	lw, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range lw.Devices {
		if d.Health != pluginapi.Healthy {
			t.Fatalf("%s is %s", d.ID, d.Health)
		}
		ids = append(ids, d.ID)
	}
	wantEqual(t, "ListAndWatch", ids, []string{m0, m1})
	alloc, err := client.Allocate(cctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{m1}}}})
	if err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "Allocate", alloc.ContainerResponses[0].Envs, map[string]string{"NVIDIA_VISIBLE_DEVICES": m1})
	wantEqual(t, "Allocate CDI", alloc.ContainerResponses[0].CdiDevices, []*pluginapi.CDIDevice{{Name: "k8s.device-plugin.nvidia.com/gpu=" + m1}})
	if _, err := client.Allocate(cctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{u0}}}}); err == nil {
		t.Fatal("allocating a device of another resource must fail")
	}
	pref, err := client.GetPreferredAllocation(cctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{m1, m0}, AllocationSize: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "preferred", pref.ContainerResponses[0].DeviceIDs, []string{m1})

	// A kubelet restart (a new kubelet.sock) brings every plugin back.
	k.stop(sockets)
	k = startKubelet(t, sockets, regs)
	defer k.srv.Stop()
	if _, err := stream.Recv(); err == nil {
		t.Fatal("ListAndWatch must end when its plugin restarts")
	}
	waitRegistrations(t, regs, 3)
	for _, s := range []string{"nvidia-gpu.sock", "nvidia-mig-1g.10gb.sock", "nvidia-mig-2g.20gb.sock"} {
		if _, err := os.Stat(filepath.Join(sockets, s)); err != nil {
			t.Fatalf("after the restart: %v", err)
		}
	}

	// Stopping removes the sockets.
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
	entries, _ := os.ReadDir(sockets)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	wantEqual(t, "sockets left", left, []string{"kubelet.sock"})
}

func TestRunPreparesMPS(t *testing.T) {
	dir := t.TempDir()
	sockets := filepath.Join(dir, "dp")
	if err := os.MkdirAll(sockets, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.json")
	body := `{"flags": {"mpsRoot": "` + dir + `/mps"}, "sharing": {"mps": {"renameByDefault": true, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}, ` + twoGPUs + `}`
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	regs := make(chan *pluginapi.RegisterRequest, 4)
	k := startKubelet(t, sockets, regs)
	defer k.srv.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{ConfigPath: cfg, SocketDir: sockets, PollInterval: 50 * time.Millisecond}, nil)
	}()
	defer func() {
		cancel()
		<-done
	}()
	got := waitRegistrations(t, regs, 1)
	wantEqual(t, "resource", got[0].ResourceName, "nvidia.com/gpu.shared")
	for _, p := range []string{"mps/shm", "mps/nvidia.com/gpu.shared/pipe", "mps/nvidia.com/gpu.shared/.started"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "mps/nvidia.com/gpu.shared/log", MPSCommandsFile))
	if err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "commands", string(b), "set_default_device_pinned_mem_limit 0 20480M\nset_default_device_pinned_mem_limit 1 20480M\nset_default_active_thread_percentage 25\n")
}

func TestRegistersWhenKubeletComesLater(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte(`{`+twoGPUs+`}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{ConfigPath: cfg, SocketDir: dir, RetryInterval: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond}, nil)
	}()
	defer func() {
		cancel()
		<-done
	}()
	time.Sleep(300 * time.Millisecond)
	regs := make(chan *pluginapi.RegisterRequest, 16)
	k := startKubelet(t, dir, regs)
	defer k.srv.Stop()
	got := waitRegistrations(t, regs, 1)
	wantEqual(t, "resource", got[0].ResourceName, "nvidia.com/gpu")
}
