//go:build tools

// Package tools pins konnectivity for the hcp-olm test environment.
package tools

import (
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/server"
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/agent"
)
