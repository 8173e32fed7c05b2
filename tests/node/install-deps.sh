#!/usr/bin/env bash
# Installs the node's parts that come from Debian's packages (`make node-deps`, run by `make test`):
# runc (the OCI runtime containerd starts), the CNI plugins (bridge, host-local, loopback, portmap),
# iptables (kube-proxy's mode), conntrack (kube-proxy clears stale UDP entries with it), umoci
# (builds the images without a Docker engine), gcc + libc6-dev (the pause binary, static), and
# iproute2, jq and curl (the node's network, the image builder and the end-to-end steps).
#
# A no-op when all of them are installed; otherwise `apt-get install` (CI runs as root on a fresh
# machine). containerd itself is built from its Go module by tests/control-plane/build.sh: Debian
# 12's 1.6 is older than the kubelet accepts.
set -euo pipefail

packages=(runc containernetworking-plugins iptables conntrack umoci gcc libc6-dev iproute2 jq curl)

missing=()
for package in "${packages[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)"
    [[ "$status" == "install ok installed" ]] || missing+=("$package")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "node-deps: installed (${packages[*]})"
    exit 0
fi
if [[ $EUID -ne 0 ]]; then
    echo "node-deps: missing ${missing[*]}; install them as root (apt-get install ${missing[*]})" >&2
    exit 1
fi
echo "node-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "node-deps: installed ${missing[*]}"
