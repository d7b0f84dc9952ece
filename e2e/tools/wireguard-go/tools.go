//go:build tools

// Package tools pins wireguard-go for the hcp-olm test environment.
package tools

import (
	_ "golang.zx2c4.com/wireguard"
)
