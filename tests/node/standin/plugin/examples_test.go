package plugin

import (
	"path/filepath"
	"testing"
)

// TestExamples keeps the example configurations valid, and says what each advertises.
func TestExamples(t *testing.T) {
	want := map[string]map[string]int{
		"whole.json":        {"nvidia.com/gpu": 2},
		"time-slicing.json": {"nvidia.com/gpu": 8},
		"mps.json":          {"nvidia.com/gpu.shared": 4},
		"mig-mixed.json":    {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-3g.40gb": 1},
	}
	files, _ := filepath.Glob("../examples/*.json")
	if len(files) != len(want) {
		t.Fatalf("examples: %v", files)
	}
	for _, f := range files {
		c, err := LoadConfig(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		n, err := NewNode(c)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		got := map[string]int{}
		for _, r := range n.Resources {
			got[r.Name] = len(r.Devices)
		}
		wantEqual(t, f, got, want[filepath.Base(f)])
	}
}
