//go:build tools

// Package tools pins runc, the OCI runtime containerd's shim runs containers with.
package tools

import (
	_ "github.com/opencontainers/runc"
)
