//go:build tools

// Package tools pins rancher's local-path-provisioner, the real node's volume provisioner.
package tools

import (
	_ "github.com/rancher/local-path-provisioner"
)
