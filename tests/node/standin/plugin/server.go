package plugin

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// server is the gRPC device plugin of one resource (internal/plugin/server.go's
// nvidiaDevicePlugin).
type server struct {
	pluginapi.UnimplementedDevicePluginServer
	node   *Node
	res    *Resource
	socket string
	grpc   *grpc.Server
	stop   chan struct{}
	done   chan struct{}
}

// SocketName is the plugin's socket for a resource: nvidia-<name>.sock
// (internal/plugin/server.go's getPluginSocketPath).
func SocketName(resource string) string {
	_, name := splitResource(resource)
	return "nvidia-" + name + ".sock"
}

func newServer(node *Node, res *Resource, socketDir string) *server {
	return &server{node: node, res: res, socket: filepath.Join(socketDir, SocketName(res.Name))}
}

// serve listens on the plugin's socket and waits until it answers (internal/plugin/server.go's
// Serve).
func (s *server) serve() error {
	_ = os.Remove(s.socket)
	l, err := net.Listen("unix", s.socket)
	if err != nil {
		return err
	}
	s.grpc = grpc.NewServer()
	s.stop = make(chan struct{})
	s.done = make(chan struct{})
	pluginapi.RegisterDevicePluginServer(s.grpc, s)
	go func() {
		defer close(s.done)
		if err := s.grpc.Serve(l); err != nil {
			log.Printf("gRPC server for %q stopped: %v", s.res.Name, err)
		}
	}()
	conn, err := dial(context.Background(), s.socket)
	if err != nil {
		s.shutdown()
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	conn.Close()
	if err != nil {
		s.shutdown()
		return fmt.Errorf("plugin socket %s does not answer: %w", s.socket, err)
	}
	return nil
}

// register registers the plugin with kubelet (internal/plugin/server.go's Register).
func (s *server) register(ctx context.Context, kubeletSocket string) error {
	conn, err := dial(ctx, kubeletSocket)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(s.socket),
		ResourceName: s.res.Name,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	}, grpc.WaitForReady(true))
	return err
}

// shutdown stops the server and removes its socket (internal/plugin/server.go's Stop).
func (s *server) shutdown() {
	if s.grpc == nil {
		return
	}
	close(s.stop)
	s.grpc.Stop()
	<-s.done
	s.grpc = nil
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Printf("removing %s: %v", s.socket, err)
	}
}

func dial(ctx context.Context, socket string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
}

// GetDevicePluginOptions answers as internal/plugin/server.go's does.
func (s *server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the devices, all healthy, then waits until the plugin stops
// (internal/plugin/server.go's ListAndWatch; the stand-in GPUs never turn unhealthy).
func (s *server) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	devs := make([]*pluginapi.Device, 0, len(s.res.Devices))
	for _, d := range s.res.Devices {
		devs = append(devs, d.pluginDevice())
	}
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	select {
	case <-s.stop:
	case <-stream.Context().Done():
	}
	return nil
}

// GetPreferredAllocation answers as internal/plugin/server.go's does.
func (s *server) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, req := range r.ContainerRequests {
		ids, err := s.node.PreferredAllocation(s.res, req.AvailableDeviceIDs, req.MustIncludeDeviceIDs, int(req.AllocationSize))
		if err != nil {
			return nil, fmt.Errorf("error getting list of preferred allocation devices: %v", err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate answers as internal/plugin/server.go's Allocate does.
func (s *server) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, req := range r.ContainerRequests {
		c, err := s.node.Allocate(s.res.Name, req.DevicesIds)
		if err != nil {
			log.Printf("Allocate %q %v: %v", s.res.Name, req.DevicesIds, err)
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, c)
	}
	log.Printf("Allocate %q: %d container(s)", s.res.Name, len(resp.ContainerResponses))
	return resp, nil
}

// PreStartContainer does nothing, as internal/plugin/server.go's.
func (s *server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Options are how Run runs the plugin.
type Options struct {
	ConfigPath string
	// SocketDir holds kubelet.sock and the plugins' sockets.
	SocketDir string
	// CDIDir receives the device plugin's CDI spec when a CDI strategy is on.
	CDIDir string
	// NvidiaCTKSpec, when set, is where the nvidia-ctk form of the CDI spec is written too.
	NvidiaCTKSpec string
	// RetryInterval is how long a failed start waits before the next (NVIDIA's: 30 s).
	RetryInterval time.Duration
	// PollInterval is how often kubelet.sock is looked at for a kubelet restart.
	PollInterval time.Duration
}

// Run runs the plugins until ctx ends, following cmd/nvidia-device-plugin/main.go's start:
// load the configuration, write the CDI spec, serve and register one plugin per resource;
// restart them all when kubelet.sock is created anew (a kubelet restart) or on hup; retry a
// failed start after RetryInterval. On return every plugin socket is removed.
func Run(ctx context.Context, o Options, hup <-chan struct{}) error {
	if o.RetryInterval <= 0 {
		o.RetryInterval = 30 * time.Second
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	kubeletSocket := filepath.Join(o.SocketDir, filepath.Base(pluginapi.KubeletSocket))
	var servers []*server
	stopAll := func() {
		for _, s := range servers {
			log.Printf("Stopping to serve %q on %s", s.res.Name, s.socket)
			s.shutdown()
		}
		servers = nil
	}
	defer stopAll()

	for {
		stopAll()
		seen := socketIdentity(kubeletSocket)
		var err error
		servers, err = start(ctx, o, kubeletSocket)
		if ctx.Err() != nil {
			return nil
		}
		var retry <-chan time.Time
		if err != nil {
			log.Printf("Failed to start the plugins: %v; retrying in %v", err, o.RetryInterval)
			stopAll()
			retry = time.After(o.RetryInterval)
		}
		tick := time.NewTicker(o.PollInterval)
	wait:
		for {
			select {
			case <-ctx.Done():
				tick.Stop()
				return nil
			case <-hup:
				log.Printf("Received SIGHUP, restarting.")
				break wait
			case <-retry:
				break wait
			case <-tick.C:
				now := socketIdentity(kubeletSocket)
				if now != "" && now != seen {
					log.Printf("%s created, restarting.", kubeletSocket)
					break wait
				}
				seen = now
			}
		}
		tick.Stop()
	}
}

func start(ctx context.Context, o Options, kubeletSocket string) ([]*server, error) {
	c, err := LoadConfig(o.ConfigPath)
	if err != nil {
		return nil, fmt.Errorf("unable to load config: %v", err)
	}
	node, err := NewNode(c)
	if err != nil {
		return nil, fmt.Errorf("unable to create plugins: %w", err)
	}
	if c.AnyCDIEnabled() {
		if err := WriteCDISpec(c, FormDevicePlugin, filepath.Join(o.CDIDir, SpecFileName(FormDevicePlugin))); err != nil {
			return nil, fmt.Errorf("unable to create cdi spec file: %v", err)
		}
	}
	if o.NvidiaCTKSpec != "" {
		if err := WriteCDISpec(c, FormNvidiaCTK, o.NvidiaCTKSpec); err != nil {
			return nil, fmt.Errorf("unable to write %s: %v", o.NvidiaCTKSpec, err)
		}
	}
	if c.SharingStrategy() == SharingStrategyMPS {
		if err := PrepareMPS(node); err != nil {
			return nil, err
		}
	}
	var servers []*server
	for _, r := range node.Resources {
		s := newServer(node, r, o.SocketDir)
		if err := s.serve(); err != nil {
			return servers, fmt.Errorf("could not start device plugin for %q: %w", r.Name, err)
		}
		servers = append(servers, s)
		log.Printf("Starting to serve %q on %s", r.Name, s.socket)
		if err := s.register(ctx, kubeletSocket); err != nil {
			return servers, fmt.Errorf("could not register device plugin %q: %w", r.Name, err)
		}
		log.Printf("Registered device plugin for %q with Kubelet (%d devices)", r.Name, len(r.Devices))
	}
	return servers, nil
}

// socketIdentity tells one kubelet.sock from the next: device, inode and change time ("" when
// there is none).
func socketIdentity(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fi.ModTime().String()
	}
	return fmt.Sprintf("%d:%d:%d.%d", st.Dev, st.Ino, st.Ctim.Sec, st.Ctim.Nsec)
}
