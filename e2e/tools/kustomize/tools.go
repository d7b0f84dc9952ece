//go:build tools

// Package tools pins kustomize for the hcp-olm test environment.
package tools

import (
	_ "sigs.k8s.io/kustomize/kustomize/v5"
)
