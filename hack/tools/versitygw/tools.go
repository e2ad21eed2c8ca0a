//go:build tools

// Package tools pins versitygw, the S3-compatible server the object-storage tests run against.
package tools

import (
	_ "github.com/versity/versitygw/cmd/versitygw"
)
