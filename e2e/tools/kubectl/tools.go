//go:build tools

// Package tools pins kubectl for the hcp-olm test environment (docs/install.md's commands).
package tools

import _ "k8s.io/kubernetes/cmd/kubectl"
