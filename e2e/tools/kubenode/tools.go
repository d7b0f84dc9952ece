//go:build tools

// Package tools pins the node and controller binaries (kubelet, kube-proxy,
// kube-controller-manager, kube-scheduler) of the hcp-olm real-node test environment.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
