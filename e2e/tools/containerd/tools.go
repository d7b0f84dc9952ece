//go:build tools

// Package tools pins containerd (daemon, runc shim, ctr) for the hcp-olm real-node test environment.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
