#!/usr/bin/env bash
# make release VERSION=x.y.z [REGISTRY=host/org]: everything a release ships, into
# target/release-<version>/ (docs/release.md):
#   - the image indexes (amd64 + arm64) in target/images, pushed when REGISTRY is set;
#   - hcp-olm-<version>-linux-{amd64,arm64}.tar.gz with every shipped binary, and SHA256SUMS;
#   - images.txt: each image as <ref>@<index digest>;
#   - hcp-olm-<version>.tgz: the Helm chart with every image of ours pinned by digest;
#   - hcp-olm-<version>.yaml: manifests/ with the same digests (kustomize);
#   - the SBOMs and the provenance statement of the images;
#   - krew-hcp-olm.yaml: the kubectl plugin's krew manifest (both archives by sha256);
#   - a CHANGELOG.md entry (inserted once per version).
# For the test (images/tests/release.rs): RELEASE_SKIP_BUILD=1 packs binaries already built,
# RELEASE_BIN_DIR (with {target}), RELEASE_OUT, RELEASE_CHANGELOG, RELEASE_ALLOW_DIRTY=1.
set -euo pipefail
say() { echo "== make release: $*" >&2; }
die() { echo "make release: $*" >&2; exit 64; }

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${VERSION:-}
[ -n "$version" ] || die "VERSION is required, e.g. make release VERSION=0.1.0"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || die "VERSION=$version is not x.y.z[-pre]"
workspace=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[ "$version" = "$workspace" ] || die "VERSION=$version but the workspace version (Cargo.toml [workspace.package]) is $workspace: bump it (and charts/hcp-olm/Chart.yaml) in a commit first"
chart_version=$(sed -n 's/^version: //p' charts/hcp-olm/Chart.yaml)
[ "$chart_version" = "$version" ] || die "charts/hcp-olm/Chart.yaml says version $chart_version, not $version"
if [ "${RELEASE_ALLOW_DIRTY:-0}" != 1 ] && [ -n "$(git status --porcelain 2>/dev/null)" ]; then
  die "the working tree has changes: a release is built from a commit (git status)"
fi
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
target_dir=${CARGO_TARGET_DIR:-target}
out=${RELEASE_OUT:-$target_dir/release-$version}
default_bin_dir="$target_dir/{target}/dist"
bin_dir=${RELEASE_BIN_DIR:-$default_bin_dir}
registry=${REGISTRY:-quay.io/hcp-olm}
images_tool=${HCP_OLM_IMAGES:-$target_dir/dist/hcp-olm-images}
shipped=(-p hcp-olm-controlplane -p hcp-olm-guest-agent -p hcp-olm-catalog -p hcp-olm-cli)
bins=(hcp-olm-controller hcp-olm-gateway hcp-olm-agent hcp-olm-dns hcp-olm-tunnel hcp-olm-catalog-server hcp-olm kubectl-hcp_olm)

if [ "${RELEASE_SKIP_BUILD:-0}" != 1 ]; then
  say "building the shipped binaries for amd64 and arm64 (static, profile dist; about 16 minutes cold on 2 cores)"
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --profile dist --locked \
    --target x86_64-unknown-linux-gnu --target aarch64-unknown-linux-gnu "${shipped[@]}" --bins
  cargo build --profile dist --locked -p hcp-olm-images
fi
command -v helm >/dev/null || die "helm is not on PATH (make tools builds it; add \$(e2e/tools/build.sh --bin-dir))"
command -v kustomize >/dev/null || die "kustomize is not on PATH (make tools builds it)"

rm -rf "$out"
mkdir -p "$out"
say "packing the images (one index per component) into $out/images"
push=()
[ -n "${REGISTRY:-}" ] && push=(--push)
"$images_tool" --bin-dir "$bin_dir" --out "$out/images" --registry "$registry" \
  --image-version "$version" --revision "$revision" --source-date-epoch "$epoch" "${push[@]}" >"$out/images.log"
cat "$out/images.log" >&2

# <ref>@<index digest> of every image, from the layout.
python3 - "$out/images/index.json" >"$out/images.txt" <<'PY'
import json, sys
for m in json.load(open(sys.argv[1]))["manifests"]:
    print(f'{m["annotations"]["org.opencontainers.image.ref.name"]}@{m["digest"]}')
PY
digest_of() { sed -n "s#^$registry/$1:v$version@\\(sha256:[0-9a-f]*\\)\$#\\1#p" "$out/images.txt"; }
for c in hcp-olm-controller hcp-olm-catalog-server hcp-olm-tunnel-gateway hcp-olm-guest-agent; do
  [ -n "$(digest_of "$c")" ] || die "no image index for $c in $out/images.txt"
done

say "binaries for both architectures, with checksums"
for arch in amd64 arm64; do
  case $arch in amd64) triple=x86_64-unknown-linux-gnu ;; arm64) triple=aarch64-unknown-linux-gnu ;; esac
  dir="${bin_dir//\{target\}/$triple}"
  stage=$(mktemp -d)
  mkdir -p "$stage/hcp-olm-$version-linux-$arch"
  for b in "${bins[@]}"; do
    cp "$dir/$b" "$stage/hcp-olm-$version-linux-$arch/$b"
    chmod 0755 "$stage/hcp-olm-$version-linux-$arch/$b"
  done
  cp LICENSE "$stage/hcp-olm-$version-linux-$arch/" 2>/dev/null || true
  # Reproducible archives: sorted names, fixed owner and time, gzip without name or time.
  tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
    -C "$stage" -cf - "hcp-olm-$version-linux-$arch" | gzip -n -9 >"$out/hcp-olm-$version-linux-$arch.tar.gz"
  rm -rf "$stage"
done

say "the Helm chart, pinned by digest"
stage=$(mktemp -d)
cp -r charts/hcp-olm "$stage/hcp-olm"
python3 - "$stage/hcp-olm/values.yaml" "$registry" \
  "$(digest_of hcp-olm-controller)" "$(digest_of hcp-olm-catalog-server)" \
  "$(digest_of hcp-olm-tunnel-gateway)" "$(digest_of hcp-olm-guest-agent)" <<'PY'
import re, sys
path, registry, ctl, cat, gw, agent = sys.argv[1:]
text = open(path).read()
text = re.sub(r'(?m)^  registry: .*$', f'  registry: {registry}', text, count=1)
for key, digest in [("controller", ctl), ("catalogServer", cat), ("tunnelGateway", gw), ("guestAgent", agent)]:
    # the digest line of image.<key>
    pat = re.compile(rf'(?m)^(  {key}:\n(?:    .*\n)*?    digest: )""')
    text, n = pat.subn(rf'\g<1>"{digest}"', text, count=1)
    if n != 1:
        sys.exit(f"values.yaml: no image.{key}.digest to pin")
open(path, "w").write(text)
PY
helm lint --strict "$stage/hcp-olm" --namespace hcp-olm-system >/dev/null
helm package "$stage/hcp-olm" --version "$version" --app-version "$version" --destination "$out" >/dev/null
rm -rf "$stage"

say "manifests/, pinned by digest"
stage=$(mktemp -d)
mkdir -p "$stage/release"
cp -r manifests "$stage/manifests"
cat >"$stage/release/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../manifests
images:
  - name: quay.io/hcp-olm/hcp-olm-controller
    newName: $registry/hcp-olm-controller
    digest: $(digest_of hcp-olm-controller)
patches:
  - target: {kind: Deployment, name: hcp-olm-controller}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --catalog-server-image=$registry/hcp-olm-catalog-server@$(digest_of hcp-olm-catalog-server)
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --tunnel-gateway-image=$registry/hcp-olm-tunnel-gateway@$(digest_of hcp-olm-tunnel-gateway)
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --guest-agent-image=$registry/hcp-olm-guest-agent@$(digest_of hcp-olm-guest-agent)
EOF
kustomize build "$stage/release" >"$out/hcp-olm-$version.yaml"
rm -rf "$stage"

say "the krew manifest of the kubectl plugin"
{
  echo "apiVersion: krew.googlecontainertools.github.com/v1alpha2"
  echo "kind: Plugin"
  echo "metadata:"
  echo "  name: hcp-olm"
  echo "spec:"
  echo "  version: v$version"
  echo "  homepage: https://github.com/hcp-olm/hcp-olm"
  echo "  shortDescription: \"OLM for HyperShift hosted clusters (status, doctor, catalogs, uninstall)\""
  echo "  description: |"
  echo "    kubectl hcp-olm status -A lists every hosted cluster's OLM; kubectl hcp-olm doctor NAME"
  echo "    walks the path of a catalog read and names the first hop that fails."
  echo "  platforms:"
  for arch in amd64 arm64; do
    archive="hcp-olm-$version-linux-$arch.tar.gz"
    echo "  - selector:"
    echo "      matchLabels:"
    echo "        os: linux"
    echo "        arch: $arch"
    echo "    uri: https://github.com/hcp-olm/hcp-olm/releases/download/v$version/$archive"
    echo "    sha256: $(sha256sum "$out/$archive" | cut -d' ' -f1)"
    echo "    files:"
    echo "    - from: hcp-olm-$version-linux-$arch/kubectl-hcp_olm"
    echo "      to: ."
    echo "    bin: kubectl-hcp_olm"
  done
} >"$out/krew-hcp-olm.yaml"

cp -r "$out/images/sbom" "$out/sbom"
cp "$out/images/provenance.intoto.json" "$out/"

(cd "$out" && sha256sum hcp-olm-*.tar.gz "hcp-olm-$version.tgz" "hcp-olm-$version.yaml" images.txt provenance.intoto.json krew-hcp-olm.yaml >SHA256SUMS)

say "CHANGELOG entry"
changelog=${RELEASE_CHANGELOG:-CHANGELOG.md}
date=$(date -u -d "@$epoch" +%Y-%m-%d)
prev=$(git describe --tags --abbrev=0 2>/dev/null || true)
{
  echo "## v$version ($date)"
  echo
  echo "Built from \`$revision\`. Images (amd64 and arm64, one index each):"
  echo
  sed 's/^/- `/; s/$/`/' "$out/images.txt"
  echo
  if [ -n "$prev" ]; then echo "Changes since $prev:"; else echo "Changes (the last 30 commits; no earlier release tag):"; fi
  echo
  if [ -n "$prev" ]; then git log --format='- %s' "$prev..HEAD"; else git log -30 --format='- %s' 2>/dev/null || true; fi
  echo
} >"$out/CHANGELOG-entry.md"
if [ -f "$changelog" ] && grep -q "^## v$version " "$changelog"; then
  say "$changelog already has v$version: left as it is"
else
  { echo "# Changelog"; echo; cat "$out/CHANGELOG-entry.md"; [ -f "$changelog" ] && sed '1{/^# Changelog$/d}' "$changelog" | sed '1{/^$/d}'; } >"$changelog.new"
  mv "$changelog.new" "$changelog"
fi

say "done: $out"
ls -1 "$out" >&2
