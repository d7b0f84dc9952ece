//go:build tools

// Package tools pins kube-router for the hcp-olm test environment.
package tools

import (
	_ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
)
