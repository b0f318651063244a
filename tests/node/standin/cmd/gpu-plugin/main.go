// Command gpu-plugin is the stand-in for NVIDIA's k8s-device-plugin on a node without a GPU.
//
//	gpu-plugin [serve] --config FILE [--socket-dir DIR] [--cdi-dir DIR] [--nvidia-ctk-spec FILE]
//	gpu-plugin cdi-spec --config FILE [--form nvidia-ctk|device-plugin] [--output FILE|-]
//	gpu-plugin devices --config FILE [--dir DIR]
//	gpu-plugin list --config FILE
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gpu-share/gpu-share/tests/node/standin/plugin"
)

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("gpu-plugin: ")
	args := os.Args[1:]
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "serve":
		err = serve(args)
	case "cdi-spec":
		err = cdiSpec(args)
	case "devices":
		err = devices(args)
	case "list":
		err = list(args)
	default:
		err = fmt.Errorf("unknown command %q (serve, cdi-spec, devices, list)", cmd)
	}
	if err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	o := plugin.Options{}
	fs.StringVar(&o.ConfigPath, "config", "", "the stand-in configuration (JSON or YAML)")
	fs.StringVar(&o.SocketDir, "socket-dir", "/var/lib/kubelet/device-plugins", "kubelet's device-plugin directory (kubelet.sock and the plugins' sockets)")
	fs.StringVar(&o.CDIDir, "cdi-dir", "/var/run/cdi", "where the device plugin's CDI spec is written when a CDI strategy is on")
	fs.StringVar(&o.NvidiaCTKSpec, "nvidia-ctk-spec", "", "also write the nvidia-ctk form of the CDI spec (kind nvidia.com/gpu) to this file")
	fs.DurationVar(&o.RetryInterval, "retry-interval", 5*time.Second, "wait before retrying a failed start (NVIDIA's plugin waits 30s)")
	fs.DurationVar(&o.PollInterval, "poll-interval", time.Second, "how often kubelet.sock is checked for a kubelet restart")
	_ = fs.Parse(args)
	if o.ConfigPath == "" {
		return fmt.Errorf("--config is required")
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT)
	defer cancel()
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	hup := make(chan struct{})
	go func() {
		for range hups {
			select {
			case hup <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
	}()
	log.Printf("starting: config %s, sockets in %s", o.ConfigPath, o.SocketDir)
	err := plugin.Run(ctx, o, hup)
	log.Printf("stopped")
	return err
}

func cdiSpec(args []string) error {
	fs := flag.NewFlagSet("cdi-spec", flag.ExitOnError)
	config := fs.String("config", "", "the stand-in configuration")
	form := fs.String("form", plugin.FormNvidiaCTK, "nvidia-ctk (kind nvidia.com/gpu, as nvidia-ctk cdi generate and the GPU Operator write) or device-plugin (kind k8s.device-plugin.nvidia.com/gpu)")
	output := fs.String("output", "-", "the file to write (.json: JSON, .yaml/.yml: YAML), or - for JSON on stdout")
	cdiDir := fs.String("cdi-dir", "", "write to the file NVIDIA's tooling uses in this directory (nvidia.yaml or k8s.device-plugin.nvidia.com-gpu.json) instead of --output")
	_ = fs.Parse(args)
	c, err := plugin.LoadConfig(*config)
	if err != nil {
		return err
	}
	path := *output
	if *cdiDir != "" {
		path = filepath.Join(*cdiDir, plugin.SpecFileName(*form))
	}
	if path == "-" {
		spec, err := plugin.BuildCDISpec(c, *form)
		if err != nil {
			return err
		}
		b, err := plugin.MarshalCDISpec(spec, "stdout.json")
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(b)
		return err
	}
	if err := plugin.WriteCDISpec(c, *form, path); err != nil {
		return err
	}
	log.Printf("wrote %s", path)
	return nil
}

func devices(args []string) error {
	fs := flag.NewFlagSet("devices", flag.ExitOnError)
	config := fs.String("config", "", "the stand-in configuration")
	dir := fs.String("dir", "", "where to make the nodes (default: the configuration's standin.deviceDir)")
	_ = fs.Parse(args)
	c, err := plugin.LoadConfig(*config)
	if err != nil {
		return err
	}
	made, err := plugin.MakeDeviceNodes(c, *dir)
	for _, p := range made {
		fmt.Println(p)
	}
	return err
}

func list(args []string) error {
	fs := flag.NewFlagSet("list", flag.ExitOnError)
	config := fs.String("config", "", "the stand-in configuration")
	_ = fs.Parse(args)
	c, err := plugin.LoadConfig(*config)
	if err != nil {
		return err
	}
	node, err := plugin.NewNode(c)
	if err != nil {
		return err
	}
	out := map[string][]string{}
	for _, r := range node.Resources {
		out[r.Name] = r.IDs()
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
