#!/usr/bin/env bash
# Builds the images without a Docker engine (`make images`): the operator, the producer and the
# stub inference server from their Dockerfiles, and the pause image the end-to-end node's
# containerd runs as every pod's sandbox.
#
# Each Dockerfile stays the one definition of its image: its last stage (FROM scratch, the
# binary, user, ports, OCI labels, entrypoint and command; images/dockerfile_stage.py reads it)
# is built here with umoci from Debian, around the same binary its builder stage makes: a static
# release build (`+crt-static` on the gnu target). The pause image is Kubernetes' own
# (build/pause in the k8s.io/kubernetes module tests/control-plane/ pins), compiled as its
# Makefile does.
#
# Out: $IMAGE_OUT (default target/images)/<name>.tar, OCI image archives that
# `ctr images import` and `skopeo copy oci-archive:...` read, each named
# $IMAGE_REPOSITORY/burst-prefix-<name>:$IMAGE_TAG (defaults: the chart's, ghcr.io/burst-prefix
# and the workspace version), and <name>.ref with that name.
#
# Usage:
#   images/build.sh               build all four
#   images/build.sh --print-refs  print "<name> <ref> <archive>" per image and exit
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

version="$(awk -F'"' '/^\[workspace.package\]/ { in_package = 1; next }
    /^\[/ { in_package = 0 } in_package && $1 ~ /^version *= */ { print $2; exit }' Cargo.toml)"
[[ -n "$version" ]] || { echo "images: no version in [workspace.package] of Cargo.toml" >&2; exit 1; }
repository="${IMAGE_REPOSITORY:-ghcr.io/burst-prefix}"
tag="${IMAGE_TAG:-$version}"
out="${IMAGE_OUT:-$root/target/images}"

# name -> Dockerfile; the pause image has none (see build_pause).
products=(operator producer stub-engine)
# Kubernetes' pause: build/pause of the k8s.io/kubernetes module that tests/control-plane/ pins.
pause_source="$(cd tests/control-plane/kubernetes && GOTOOLCHAIN=local GOFLAGS=-mod=mod \
    go mod download -json k8s.io/kubernetes | jq -r .Dir)/build/pause"
pause_tag="$(awk '$1 == "TAG" && $2 == "?=" { print $3 }' "$pause_source/Makefile" 2>/dev/null || true)"
[[ -n "$pause_tag" ]] || { echo "images: no build/pause in $pause_source" >&2; exit 1; }

ref_of() { # <name>
    if [[ "$1" == pause ]]; then
        echo "$repository/burst-prefix-pause:$pause_tag"
    else
        echo "$repository/burst-prefix-$1:$tag"
    fi
}

if [[ "${1:-}" == "--print-refs" ]]; then
    for name in "${products[@]}" pause; do
        echo "$name $(ref_of "$name") $out/$name.tar"
    done
    exit 0
elif [[ $# -gt 0 ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi

for tool in umoci gcc readelf python3 jq; do
    command -v "$tool" >/dev/null || {
        echo "images: $tool is missing (tests/node/install-deps.sh installs it)" >&2
        exit 1
    }
done

case "$(uname -m)" in
x86_64) arch=amd64 ;;
aarch64) arch=arm64 ;;
*) echo "images: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac
triple="$(rustc -vV | sed -n 's/^host: //p')"
mkdir -p "$out"

# Unless CARGO_TARGET_DIR says otherwise, this release build keeps its own target directory in
# the cache, so that on a fresh clone only the workspace's crates are compiled again (about
# 1.5 min instead of 5.5 on 2 cores; it held 1.1 GB here). Started afresh past 4 GiB, since
# every dependency version ever built stays in it.
if [[ -z "${CARGO_TARGET_DIR:-}" ]]; then
    export CARGO_TARGET_DIR="${BURST_PREFIX_CACHE:-$HOME/.cache/burst-prefix}/images-target"
    if [[ -d "$CARGO_TARGET_DIR" ]] && (($(du -sm "$CARGO_TARGET_DIR" | cut -f1) > 4096)); then
        echo "images: $CARGO_TARGET_DIR outgrew 4 GiB; starting it afresh"
        rm -rf "$CARGO_TARGET_DIR"
    fi
fi

# The binaries, as the Dockerfiles' builder stages build them (--target: RUSTFLAGS reach only
# the binaries, not build scripts and proc macros).
packages=()
for name in "${products[@]}"; do packages+=(-p "burst-prefix-$name" --bin "burst-prefix-$name"); done
echo "images: building static release binaries (${products[*]})"
RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked --target "$triple" "${packages[@]}"
# Where cargo put them: CARGO_TARGET_DIR, set above unless it was given.
target_dir="$(cargo metadata --format-version 1 --no-deps --locked | jq -r .target_directory)"
release_dir="$target_dir/$triple/release"

require_static() { # <binary>
    # The whole program header read first, then matched: `readelf | grep -q` under pipefail
    # fails at random when grep exits at its first match and readelf dies of SIGPIPE.
    local headers
    headers="$(readelf -l "$1")"
    if [[ "$headers" == *"program interpreter"* ]]; then
        echo "images: $1 is dynamically linked; a scratch image cannot run it" >&2
        exit 1
    fi
}

# build_image <name> <stage JSON> <file source dir>: an OCI archive from the stage description.
build_image() {
    local name="$1" stage="$2" files="$3"
    local ref layout
    ref="$(ref_of "$name")"
    layout="$(mktemp -d "$out/.$name.XXXXXX")"
    trap "rm -rf '$layout'" RETURN
    umoci init --layout "$layout/oci"
    local image="$layout/oci:$tag"
    umoci new --image "$image"
    # One layer with the stage's files, as Docker's COPY makes it (parent directories included).
    # unpack + repack rather than `umoci insert`, whose 0.4.7 layers lack the tar end marker.
    umoci unpack --image "$image" "$layout/bundle" >/dev/null
    local source destination
    while IFS=$'\t' read -r source destination; do
        local file="$files/$(basename "$source")"
        [[ -x "$file" ]] || { echo "images: $name needs $file" >&2; exit 1; }
        require_static "$file"
        install -D -m 0755 "$file" "$layout/bundle/rootfs$destination"
    done < <(jq -r '.copies[] | [.source, .destination] | @tsv' <<<"$stage")
    umoci repack --image "$image" --history.created_by "images/build.sh: COPY" "$layout/bundle"

    local -a config=(--os linux --architecture "$arch" --created 1970-01-01T00:00:00Z
        --author burst-prefix --history.comment "images/build.sh")
    local value
    [[ "$(jq -r '.user // empty' <<<"$stage")" ]] && config+=(--config.user "$(jq -r .user <<<"$stage")")
    while IFS= read -r value; do config+=(--config.entrypoint "$value"); done \
        < <(jq -r '.entrypoint[]' <<<"$stage")
    while IFS= read -r value; do config+=(--config.cmd "$value"); done \
        < <(jq -r '.cmd // [] | .[]' <<<"$stage")
    while IFS= read -r value; do config+=(--config.exposedports "$value"); done \
        < <(jq -r '.exposed[]' <<<"$stage")
    while IFS= read -r value; do config+=(--config.label "$value"); done \
        < <(jq -r '.labels | to_entries[] | "\(.key)=\(.value)"' <<<"$stage")
    umoci config --image "$image" "${config[@]}"
    umoci gc --layout "$layout/oci"
    check_image "$name" "$stage" "$layout/oci"

    # containerd names an imported image after this annotation; the OCI one holds only the tag.
    jq --arg ref "$ref" '.manifests[0].annotations["io.containerd.image.name"] = $ref' \
        "$layout/oci/index.json" >"$layout/index.json"
    mv "$layout/index.json" "$layout/oci/index.json"
    tar -C "$layout/oci" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
        -cf "$out/.$name.tar" oci-layout index.json blobs
    mv "$out/.$name.tar" "$out/$name.tar"
    echo "$ref" >"$out/$name.ref"
    echo "images: $ref -> $out/$name.tar ($(du -h "$out/$name.tar" | cut -f1))"
}

# check_image <name> <stage JSON> <layout>: the image says what its Dockerfile stage says.
check_image() {
    local name="$1" stage="$2" oci="$3"
    local blob="$oci/blobs/sha256"
    local manifest config files
    manifest="$blob/$(jq -r '.manifests[0].digest | ltrimstr("sha256:")' "$oci/index.json")"
    config="$(cat "$blob/$(jq -r '.config.digest | ltrimstr("sha256:")' "$manifest")")"
    files="$(jq -r '.layers[].digest | ltrimstr("sha256:")' "$manifest" | while read -r layer; do
        tar -tzf "$blob/$layer"; done | sed 's|^\./||; s|^|/|' | sort)"
    local want_files
    want_files="$(jq -r '.copies[].destination' <<<"$stage" | sort)"
    if ! jq -e -n --argjson stage "$stage" --argjson image "$config" '
        $image.config as $c
        | ($c.Entrypoint == $stage.entrypoint) and (($c.Cmd // null) == $stage.cmd)
          and ($c.User == $stage.user) and (($c.Labels // {}) == $stage.labels)
          and (($c.ExposedPorts // {} | keys) == ($stage.exposed | sort))' >/dev/null \
        || [[ "$(comm -13 <(echo "$files") <(echo "$want_files"))" ]]; then
        echo "images: $name does not match its definition: $stage" >&2
        echo "images: its config: $config" >&2
        echo "images: its files: $files" >&2
        exit 1
    fi
}

for name in "${products[@]}"; do
    stage="$(python3 images/dockerfile_stage.py "Dockerfile.$name" "VERSION=$version")"
    build_image "$name" "$stage" "$release_dir"
done

# Kubernetes' pause, as build/pause/Makefile compiles it and build/pause/Dockerfile packs it.
build_pause() {
    local bin
    bin="$(mktemp -d)"
    gcc -Os -Wall -Werror -static "-DVERSION=v$pause_tag-burst-prefix" \
        -o "$bin/pause" "$pause_source/linux/pause.c"
    local stage
    stage="$(jq -n '{copies: [{source: "pause", destination: "/pause"}], user: "65535:65535",
        exposed: [], labels: {"org.opencontainers.image.title": "pause"},
        entrypoint: ["/pause"], cmd: null}')"
    build_image pause "$stage" "$bin"
    rm -rf "$bin"
}
build_pause
echo "images: ready in $out"
