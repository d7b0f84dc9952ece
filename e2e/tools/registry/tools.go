//go:build tools

// Package tools pins registry for the hcp-olm test environment.
package tools

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)
