package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// MPSCommandsFile is where, under each resource's MPS log directory, the stand-in records the
// commands NVIDIA's MPS control daemon manager sends its daemon at start.
const MPSCommandsFile = "standin-commands.log"

// PrepareMPS plays the part of NVIDIA's MPS control daemon manager for each resource (there is
// no MPS daemon without a GPU): it makes the directories the plugin's Allocate mounts (the
// resource's pipe and log directories and the shared shm directory under mpsRoot,
// cmd/mps-control-daemon/mps/root.go), the .started file the daemon manager writes, and
// records in <mpsRoot>/<resource>/log/standin-commands.log the commands
// cmd/mps-control-daemon/mps/daemon.go's Start sends: a pinned device memory limit per GPU
// (its memory over its replicas) and the active thread percentage (100 over the replicas per
// GPU).
func PrepareMPS(n *Node) error {
	root := n.Config.Flags.MpsRoot
	if err := os.MkdirAll(filepath.Join(root, "shm"), 0o755); err != nil {
		return err
	}
	for _, r := range n.Resources {
		dir := filepath.Join(root, r.Name)
		for _, sub := range []string{"pipe", "log"} {
			if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
				return err
			}
		}
		cmds := MPSDaemonCommands(r)
		if err := os.WriteFile(filepath.Join(dir, "log", MPSCommandsFile), []byte(strings.Join(cmds, "\n")+"\n"), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, ".started"), nil, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// MPSDaemonCommands are the control commands cmd/mps-control-daemon/mps/daemon.go's Start
// sends for the resource's devices (perDevicePinnedDeviceMemoryLimits, activeThreadPercentage),
// in GPU index order.
func MPSDaemonCommands(r *Resource) []string {
	total := map[string]uint64{}
	replicas := map[string]uint64{}
	uuids := map[string]bool{}
	for _, d := range r.Devices {
		total[d.Index] = d.TotalMemory
		replicas[d.Index]++
		uuids[d.UUID()] = true
	}
	var indexes []string
	for i := range total {
		indexes = append(indexes, i)
	}
	sort.Slice(indexes, func(a, b int) bool {
		x, _ := strconv.Atoi(indexes[a])
		y, _ := strconv.Atoi(indexes[b])
		return x < y
	})
	var cmds []string
	for _, i := range indexes {
		if total[i] == 0 {
			continue
		}
		cmds = append(cmds, fmt.Sprintf("set_default_device_pinned_mem_limit %s %dM", i, total[i]/replicas[i]/1024/1024))
	}
	if len(r.Devices) > 0 {
		cmds = append(cmds, fmt.Sprintf("set_default_active_thread_percentage %d", 100/(len(r.Devices)/len(uuids))))
	}
	return cmds
}
