//go:build tools

// Package tools pins etcd for the hcp-olm test environment.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
