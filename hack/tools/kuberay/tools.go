//go:build tools

// Package tools pins kuberay for the cluster test tier.
package tools

import (
	_ "github.com/ray-project/kuberay/ray-operator"
)
