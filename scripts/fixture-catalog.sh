#!/usr/bin/env bash
# Prints the directory of fixture catalog NAME (small, large, large-bundle-object) of this
# repository, unpacking fixtures/catalogs/NAME.tar.gz once into target/fixtures/ when it is
# kept as an archive (the tests do the same through hcp_olm_e2e::tools::fixture_catalog).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
name="${1:?usage: $0 NAME}"
src="$root/fixtures/catalogs"
if [ -d "$src/$name" ]; then
  echo "$src/$name"
  exit 0
fi
archive="$src/$name.tar.gz"
[ -f "$archive" ] || { echo "fixture-catalog: no catalog $name in $src" >&2; exit 2; }
sum=$(sha256sum "$archive" | cut -c1-12)
into="${CARGO_TARGET_DIR:-$root/target}/fixtures/$name-$sum"
if [ ! -d "$into/$name" ]; then
  mkdir -p "$(dirname "$into")"
  tmp=$(mktemp -d "$into.XXXXXX")
  tar -xzf "$archive" -C "$tmp"
  mv -T "$tmp" "$into" 2>/dev/null || rm -rf "$tmp"
fi
echo "$into/$name"
