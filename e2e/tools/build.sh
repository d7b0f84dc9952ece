#!/usr/bin/env bash
# Builds the pinned upstream binaries the hcp-olm tests run, into a cache outside the repo.
#   e2e/tools/build.sh            build what is missing, print progress
#   e2e/tools/build.sh --bin-dir  print the directory holding the binaries
# Cache: ${HCP_OLM_CACHE:-$HOME/.cache/hcp-olm}/tools/<tool>-<version>-<go.sum hash>/<binary>;
# stable links in $HCP_OLM_CACHE/bin point at the current pins.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$here/versions.env"
cache=${HCP_OLM_CACHE:-$HOME/.cache/hcp-olm}
bin="$cache/bin"
if [ "${1:-}" = "--bin-dir" ]; then echo "$bin"; exit 0; fi
bench=0
if [ "${1:-}" = "--bench" ]; then bench=1; fi

need_go="1.26.7"
if ! command -v go >/dev/null 2>&1; then
  echo "build-tools: no 'go' on PATH. Install Go >= $need_go (https://go.dev/dl) and run again." >&2; exit 2
fi
have_go=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -n1)" != "$need_go" ]; then
  echo "build-tools: Go $have_go is too old; OLM, opm and promtool need Go >= $need_go." >&2; exit 2
fi
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 GONOSUMDB=sigs.k8s.io/apiserver-network-proxy
mkdir -p "$bin"

probe_proxy() {
  if ! go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" >/dev/null 2>&1; then
    echo "build-tools: cannot download Go modules (GOPROXY=$(go env GOPROXY)). Check network access to the Go module proxy, or set GOPROXY to a reachable mirror." >&2
    exit 2
  fi
}
probed=0
# build <module dir> <binary name> <version> <package> [extra go build args...]
build() {
  local dir=$1 name=$2 ver=$3 pkg=$4; shift 4
  # Our own Go code (e2e/tools/pause) counts too; the wrappers' tools.go only pin imports.
  local key; key=$(cat "$here/$dir/go.mod" "$here/$dir/go.sum" $(find "$here/$dir" -maxdepth 1 -name '*.go' ! -name tools.go | sort) | sha256sum | cut -c1-12)
  local out="$cache/tools/$name-$ver-$key"
  if [ ! -x "$out/$name" ]; then
    [ "$probed" = 1 ] || { probe_proxy; probed=1; }
    echo "build-tools: building $name $ver (this takes minutes on a cold cache)..." >&2
    local start=$SECONDS
    mkdir -p "$out.tmp"
    (cd "$here/$dir" && go build -trimpath -o "$out.tmp/$name" "$@" "$pkg")
    rm -rf "$out" && mv "$out.tmp" "$out"
    echo "build-tools: built $name in $((SECONDS - start))s" >&2
  fi
  ln -sfn "$out/$name" "$bin/$name"
}

kminor=${KUBE_VERSION#v1.}; kminor=${kminor%%.*}
kube_ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ld+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$kminor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
build etcd etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 -ldflags "-s -w"
build kube kube-apiserver "$KUBE_VERSION" k8s.io/kubernetes/cmd/kube-apiserver -ldflags "$kube_ld"
olm_ld="-s -w -X github.com/operator-framework/operator-lifecycle-manager/pkg/version.OLMVersion=${OLM_VERSION#v}"
for c in catalog olm package-server copy-content; do
  build olm "$c" "$OLM_VERSION" "github.com/operator-framework/operator-lifecycle-manager/cmd/$c" -tags json1 -ldflags "$olm_ld"
done
# cpb: the copier OLM's bundle-unpack Job copies from the OLM image into the bundle's container
build olm cpb "$OLM_VERSION" github.com/operator-framework/operator-lifecycle-manager/util/cpb -ldflags "$olm_ld"
build opm opm "$OPM_VERSION" github.com/operator-framework/operator-registry/cmd/opm -tags containers_image_openpgp \
  -ldflags "-s -w -X github.com/operator-framework/operator-registry/cmd/opm/version.gitCommit=${OPM_VERSION}"
# The real nodes (e2e/src/realnode.rs): kubelet, kube-proxy, controller-manager and scheduler from the same
# Kubernetes release, containerd 2
# with its runc shim and ctr, and our pod sandbox process (e2e/tools/pause).
# kubectl: the commands of docs/install.md, run by controlplane/tests/install_doc.rs.
build kubectl kubectl "$KUBE_VERSION" k8s.io/kubernetes/cmd/kubectl -ldflags "$kube_ld"
for c in kubelet kube-proxy kube-controller-manager kube-scheduler; do
  build kubenode "$c" "$KUBE_VERSION" "k8s.io/kubernetes/cmd/$c" -ldflags "$kube_ld"
done
ctd_ld="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
for c in containerd containerd-shim-runc-v2 ctr; do
  build containerd "$c" "$CONTAINERD_VERSION" "github.com/containerd/containerd/v2/cmd/$c" \
    -tags "no_btrfs no_devmapper no_zfs" -ldflags "$ctd_ld"
done
build pause pause v1 . -ldflags "-s -w"
build registry registry "$REGISTRY_VERSION" github.com/distribution/distribution/v3/cmd/registry -ldflags "-s -w"
build wireguard-go wireguard-go "$WIREGUARD_GO_VERSION" golang.zx2c4.com/wireguard -ldflags "-s -w"
# CoreDNS: the real nodes' cluster DNS (e2e/src/clusterdns.rs) and the test images; also a DNS
# benchmark peer. (It was built for the benchmarks only, so a fresh machine's `make test` failed
# the real-node tests with "upstream tool `coredns` not found".)
build coredns coredns "$COREDNS_VERSION" github.com/coredns/coredns -ldflags "-s -w"
# kube-router in its network-policy mode only: the NetworkPolicy implementation of the real nodes
# that enforce policies (NodeOptions::network_policies; iptables and ipset in the node's network
# namespace). sigs.k8s.io/kube-network-policies needs the nftables `queue` expression
# (CONFIG_NFT_QUEUE), which the CI machines' kernels do not have.
build kube-router kube-router "$KUBE_ROUTER_VERSION" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router \
  -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION"
# promtool: `promtool check rules` and `promtool test rules` on manifests/monitoring's alerts.
build prometheus promtool "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/promtool -ldflags "-s -w"
# helm: `helm lint`, `helm template` and install/upgrade/uninstall of charts/hcp-olm.
build helm helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
# kustomize: `kustomize build` of manifests/ and manifests/overlays/*.
build kustomize kustomize "$KUSTOMIZE_VERSION" sigs.k8s.io/kustomize/kustomize/v5 \
  -ldflags "-s -w -X sigs.k8s.io/kustomize/api/provenance.version=$KUSTOMIZE_VERSION"
if [ "$bench" = 1 ]; then
  build konnectivity proxy-server "$KONNECTIVITY_VERSION" sigs.k8s.io/apiserver-network-proxy/cmd/server -ldflags "-s -w"
  build konnectivity proxy-agent "$KONNECTIVITY_VERSION" sigs.k8s.io/apiserver-network-proxy/cmd/agent -ldflags "-s -w"
fi
echo "build-tools: upstream binaries ready in $bin" >&2
