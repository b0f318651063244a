package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"
)

// The stand-in device nodes are char devices with /dev/null's numbers: opening one in a
// container is harmless, and the runtime's device cgroup already allows it.
const (
	nullMajor = 1
	nullMinor = 3
)

// DeviceNodePaths are the container paths of every stand-in device node the configuration
// needs: the control devices, each GPU's node, and each MIG device's capability nodes.
func DeviceNodePaths(c *Config) []string {
	set := map[string]bool{"/dev/nvidiactl": true, "/dev/nvidia-uvm": true, "/dev/nvidia-uvm-tools": true}
	for i := range c.Standin.GPUs {
		g := &c.Standin.GPUs[i]
		set[gpuDevice(g).Paths[0]] = true
		for j := range g.MIG {
			for _, p := range migPaths(g, &g.MIG[j]) {
				set[p] = true
			}
		}
	}
	var out []string
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// MakeDeviceNodes creates the stand-in device nodes under dir (the configuration's deviceDir
// when empty), replacing any file of the same name that is not already such a node. It
// returns the host paths.
func MakeDeviceNodes(c *Config, dir string) ([]string, error) {
	if dir == "" {
		dir = c.Standin.DeviceDir
	}
	s := c.Standin
	s.DeviceDir = dir
	var made []string
	for _, p := range DeviceNodePaths(c) {
		host := s.HostDevicePath(p)
		if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
			return made, err
		}
		if isNullCharDevice(host) {
			made = append(made, host)
			continue
		}
		if err := os.Remove(host); err != nil && !errors.Is(err, os.ErrNotExist) {
			return made, err
		}
		dev := int(unix.Mkdev(nullMajor, nullMinor))
		if err := unix.Mknod(host, unix.S_IFCHR|0o666, dev); err != nil {
			return made, fmt.Errorf("mknod %s: %w", host, err)
		}
		// mknod's mode is masked by the umask.
		if err := os.Chmod(host, 0o666); err != nil {
			return made, err
		}
		made = append(made, host)
	}
	return made, nil
}

func isNullCharDevice(path string) bool {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && unix.Major(uint64(st.Rdev)) == nullMajor && unix.Minor(uint64(st.Rdev)) == nullMinor
}
