// The CDI library containerd, CRI-O and NVIDIA's Container Toolkit share, loading the specs
// gpu-share writes beside NVIDIA's own (cdi_test.go).
module github.com/gpu-share/gpu-share/tests/cdi

go 1.26.0

require (
	github.com/opencontainers/runtime-spec v1.3.0
	golang.org/x/sys v0.19.0
	tags.cncf.io/container-device-interface v1.1.2
	tags.cncf.io/container-device-interface/specs-go v1.1.1
)

require (
	github.com/fsnotify/fsnotify v1.7.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
