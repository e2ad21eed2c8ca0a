//go:build tools

// Package tools pins fake-gcs-server, the GCS-compatible server the object-storage tests run against.
package tools

import (
	_ "github.com/fsouza/fake-gcs-server"
)
