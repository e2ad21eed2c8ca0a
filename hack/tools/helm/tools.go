//go:build tools

// Package tools pins helm for the cluster test tier.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
