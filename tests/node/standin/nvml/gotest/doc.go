// Package gotest tests the stand-in libnvidia-ml.so.1 (../nvml.c): it builds the library
// with ../build.sh and drives it through ../nvml_check.c, as nvml-wrapper would.
package gotest
