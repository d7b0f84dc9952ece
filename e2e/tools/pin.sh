#!/usr/bin/env bash
# Regenerates the wrapper modules under e2e/tools/* from versions.env.
# kube-apiserver and etcd cannot be `go install`ed (their go.mod files carry replace
# directives), so each tool gets a tiny module that requires it and, for Kubernetes,
# replaces every staging module with its published v0.x.y twin.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$here/versions.env"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local

kmod=$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
staging_ver="v0.${KUBE_VERSION#v1.}"
{
  echo "module hcp-olm/e2e/tools/kube"
  echo
  grep -E '^go ' "$kmod"
  grep -E '^godebug ' "$kmod" || true
  echo
  echo "require k8s.io/kubernetes ${KUBE_VERSION}"
  echo
  echo "replace ("
  sed -n '/^replace (/,/^)/p' "$kmod" | awk '/=> \.\/staging/ {print "\t" $1 " => " $1 " '"$staging_ver"'"}'
  echo ")"
} > "$here/kube/go.mod"
# The node binaries in their own module, so kube-apiserver's cache key does not change with them.
sed 's#^module hcp-olm/e2e/tools/kube$#module hcp-olm/e2e/tools/kubenode#' "$here/kube/go.mod" > "$here/kubenode/go.mod"
# kubectl in a module of its own too: docs/install.md's commands are run by a test.
sed 's#^module hcp-olm/e2e/tools/kube$#module hcp-olm/e2e/tools/kubectl#' "$here/kube/go.mod" > "$here/kubectl/go.mod"
cat > "$here/kubectl/tools.go" <<'GO'
//go:build tools

// Package tools pins kubectl for the hcp-olm test environment (docs/install.md's commands).
package tools

import _ "k8s.io/kubernetes/cmd/kubectl"
GO
cat > "$here/kube/tools.go" <<'GO'
//go:build tools

// Package tools pins kube-apiserver for the hcp-olm test environment.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO

write_simple() { # dir module-path version import...
  local dir=$1 mod=$2 ver=$3; shift 3
  printf 'module hcp-olm/e2e/tools/%s\n\ngo 1.26.3\n\nrequire %s %s\n' "$dir" "$mod" "$ver" > "$here/$dir/go.mod"
  {
    printf '//go:build tools\n\n// Package tools pins %s for the hcp-olm test environment.\npackage tools\n\nimport (\n' "$dir"
    for i in "$@"; do printf '\t_ "%s"\n' "$i"; done
    printf ')\n'
  } > "$here/$dir/tools.go"
}
cat > "$here/kubenode/tools.go" <<'GO'
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
GO

write_simple etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3
write_simple olm github.com/operator-framework/operator-lifecycle-manager "$OLM_VERSION" \
  github.com/operator-framework/operator-lifecycle-manager/cmd/catalog \
  github.com/operator-framework/operator-lifecycle-manager/cmd/olm \
  github.com/operator-framework/operator-lifecycle-manager/cmd/package-server
write_simple opm github.com/operator-framework/operator-registry "$OPM_VERSION" \
  github.com/operator-framework/operator-registry/cmd/opm
write_simple wireguard-go golang.zx2c4.com/wireguard "$WIREGUARD_GO_VERSION" golang.zx2c4.com/wireguard
write_simple containerd github.com/containerd/containerd/v2 "$CONTAINERD_VERSION" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
write_simple registry github.com/distribution/distribution/v3 "$REGISTRY_VERSION" \
  github.com/distribution/distribution/v3/cmd/registry

# Konnectivity: the module replaces its own client with a local directory; use the published twin.
# The checksum database has no entry for this module path, so its hashes are pinned in our go.sum.
write_simple konnectivity sigs.k8s.io/apiserver-network-proxy "$KONNECTIVITY_VERSION" \
  sigs.k8s.io/apiserver-network-proxy/cmd/server sigs.k8s.io/apiserver-network-proxy/cmd/agent
printf '\nreplace sigs.k8s.io/apiserver-network-proxy/konnectivity-client => sigs.k8s.io/apiserver-network-proxy/konnectivity-client %s\n' \
  "$KONNECTIVITY_VERSION" >> "$here/konnectivity/go.mod"
write_simple coredns github.com/coredns/coredns "$COREDNS_VERSION" github.com/coredns/coredns
write_simple kube-router github.com/cloudnativelabs/kube-router/v2 "$KUBE_ROUTER_VERSION" \
  github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
# promtool: checks and unit-tests the alerts of manifests/monitoring (controlplane/tests/alerts.rs)
write_simple prometheus github.com/prometheus/prometheus "$PROMETHEUS_VERSION" \
  github.com/prometheus/prometheus/cmd/promtool
# helm: lints, templates and installs charts/hcp-olm (controlplane/tests/helm.rs)
write_simple helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm
# kustomize: builds manifests/ and its overlays (controlplane/tests/helm.rs)
write_simple kustomize sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE_VERSION" sigs.k8s.io/kustomize/kustomize/v5

export GONOSUMDB=sigs.k8s.io/apiserver-network-proxy
for d in kube kubenode kubectl containerd etcd olm opm registry wireguard-go konnectivity coredns kube-router prometheus helm kustomize; do
  echo "pin: tidying $d" >&2
  (cd "$here/$d" && go mod tidy -e >/dev/null)
done
