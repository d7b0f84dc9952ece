//go:build tools

// Package tools pins prometheus for the hcp-olm test environment.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
