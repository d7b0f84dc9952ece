//go:build tools

// Package tools pins helm for the hcp-olm test environment.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
