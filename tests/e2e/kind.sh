#!/usr/bin/env bash
# End to end on a kind cluster (`make e2e-kind`; needs Docker, kind, kubectl, helm, curl and jq):
# the same steps as the test harness's node (`make e2e-node`), tests/e2e/steps.sh, on a new kind
# cluster, with the images built by Docker from the same Dockerfiles and loaded into it.
#
# Environment: KIND_CLUSTER (default burst-prefix-e2e), KEEP_CLUSTER=1 to keep it afterwards.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

cluster="${KIND_CLUSTER:-burst-prefix-e2e}"
log() { echo "e2e-kind: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

for tool in docker kind kubectl helm curl jq; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done

# The names and tags images/build.sh gives them (the chart's defaults), so both paths agree.
version="$(awk -F'"' '/^\[workspace.package\]/ { p = 1; next } /^\[/ { p = 0 }
    p && $1 ~ /^version *= */ { print $2; exit }' Cargo.toml)"
repository="${IMAGE_REPOSITORY:-ghcr.io/burst-prefix}"
images=()
for name in operator producer stub-engine; do
    images+=("$repository/burst-prefix-$name:$version")
done

work="$(mktemp -d)"
cleanup() {
    local status=$?
    if [[ "${KEEP_CLUSTER:-}" != 1 ]]; then
        kind delete cluster --name "$cluster" || true
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

log "creating kind cluster $cluster"
kind create cluster --name "$cluster" --wait 120s
kind get kubeconfig --name "$cluster" >"$work/kubeconfig"

for image in "${images[@]}"; do
    name="${image##*/burst-prefix-}"
    name="${name%%:*}"
    log "building $image"
    docker build -f "Dockerfile.$name" --build-arg "VERSION=$version" -t "$image" .
done
# The producer image under a second tag: what the steps roll the producers to (nothing is pulled).
producer_next="${images[1]}-roll"
docker tag "${images[1]}" "$producer_next"
kind load docker-image --name "$cluster" "${images[@]}" "$producer_next"

# kind's kindnetd enforces NetworkPolicy since kind v0.24.0 (kubernetes-sigs/kind#842).
KUBECONFIG="$work/kubeconfig" E2E_WORK="$work" E2E_NETWORK_POLICY_ENFORCED=true \
    OPERATOR_IMAGE="${images[0]}" PRODUCER_IMAGE="${images[1]}" PRODUCER_IMAGE_NEXT="$producer_next" \
    STUB_IMAGE="${images[2]}" \
    tests/e2e/steps.sh
