//go:build tools

// Package tools pins the toolkit's commands as dependencies of this module, so that
// `go mod tidy` keeps what they import in go.sum.
package tools

import (
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk"
)
