//go:build tools

// Package tools pins etcd for the cluster test tier.
package tools

import (
	_ "go.etcd.io/etcd/server/v3" // etcd
)
