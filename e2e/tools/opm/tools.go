//go:build tools

// Package tools pins opm for the hcp-olm test environment.
package tools

import (
	_ "github.com/operator-framework/operator-registry/cmd/opm"
)
