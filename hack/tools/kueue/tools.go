//go:build tools

// Package tools pins kueue for the cluster test tier.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
