//go:build tools

// Package tools pins kwok for the cluster test tier.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
	_ "sigs.k8s.io/kwok/cmd/kwokctl"
)
