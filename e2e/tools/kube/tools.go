//go:build tools

// Package tools pins kube-apiserver for the hcp-olm test environment.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
