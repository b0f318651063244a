package plugin

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

const (
	u0 = "GPU-0a1b2c3d-0000-4000-8000-000000000000"
	u1 = "GPU-0a1b2c3d-0000-4000-8000-000000000001"
	m0 = "MIG-0a1b2c3d-0000-4000-8000-0000000000a0"
	m1 = "MIG-0a1b2c3d-0000-4000-8000-0000000000a1"
	m2 = "MIG-0a1b2c3d-0000-4000-8000-0000000000a2"
	m3 = "MIG-0a1b2c3d-0000-4000-8000-0000000000a3"
)

// twoGPUs is the standin section of two whole A100s.
const twoGPUs = `"standin": {"deviceDir": "/standin/dev", "libDir": "/standin/lib", "gpus": [
	{"index": 0, "uuid": "` + u0 + `", "memoryMiB": 81920},
	{"index": 1, "uuid": "` + u1 + `", "memoryMiB": 81920}]}`

// migGPU0 is the standin section of GPU 0 in MIG mode (1g.10gb, 1g.10gb, 2g.20gb) and GPU 1
// whole.
const migGPU0 = `"standin": {"deviceDir": "/standin/dev", "gpus": [
	{"index": 0, "uuid": "` + u0 + `", "memoryMiB": 81920, "mig": [
		{"profile": "1g.10gb", "uuid": "` + m0 + `", "gpuInstance": 9},
		{"profile": "1g.10gb", "uuid": "` + m1 + `", "gpuInstance": 10},
		{"profile": "2g.20gb", "uuid": "` + m2 + `", "gpuInstance": 3}]},
	{"index": 1, "uuid": "` + u1 + `", "memoryMiB": 81920}]}`

func mustConfig(t *testing.T, body string) *Config {
	t.Helper()
	c, err := ParseConfig([]byte(body))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, body)
	}
	return c
}

func mustNode(t *testing.T, body string) *Node {
	t.Helper()
	n, err := NewNode(mustConfig(t, body))
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	n.NewID = func() string { return "11111111-2222-4333-8444-555555555555" }
	return n
}

// advertised is resource name -> device IDs.
func advertised(n *Node) map[string][]string {
	out := map[string][]string{}
	for _, r := range n.Resources {
		out[r.Name] = r.IDs()
	}
	return out
}

func replicasOf(id string, n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, NewAnnotatedID(id, i))
	}
	return out
}

func concat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

func wantEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", "  ")
		w, _ := json.MarshalIndent(want, "", "  ")
		t.Fatalf("%s:\n got  %s\n want %s", what, g, w)
	}
}

func wantErr(t *testing.T, err error, substr string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), substr) {
		t.Fatalf("want an error with %q, got %v", substr, err)
	}
}
