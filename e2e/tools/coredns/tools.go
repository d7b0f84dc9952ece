//go:build tools

// Package tools pins coredns for the hcp-olm test environment.
package tools

import (
	_ "github.com/coredns/coredns"
)
