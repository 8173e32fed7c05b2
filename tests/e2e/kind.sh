#!/usr/bin/env bash
# End to end on a kind cluster (`make e2e-kind`; needs Docker, kind, kubectl, helm and curl).
#
# Builds both images (Dockerfile.operator, Dockerfile.producer), loads them into a new kind
# cluster, installs the chart, runs a stand-in inference Deployment (2 replicas of a tiny HTTP
# server on port 8000), applies examples/vllm-policy.yaml, and sends a burst of 8 identical
# requests to the producer through a port-forward: all 8 must be assigned to one replica.
#
# Environment: KIND_CLUSTER (default burst-prefix-e2e), KEEP_CLUSTER=1 to keep it afterwards,
# ECHO_IMAGE (the stand-in server), LOCAL_PORT (default 18080).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

cluster="${KIND_CLUSTER:-burst-prefix-e2e}"
local_port="${LOCAL_PORT:-18080}"
echo_image="${ECHO_IMAGE:-hashicorp/http-echo:1.0}"
# The chart's appVersion and the CRD's default producer image: no image values to override.
version="$(awk '$1 == "appVersion:" { gsub(/"/, "", $2); print $2 }' charts/burst-prefix/Chart.yaml)"
operator_image="ghcr.io/burst-prefix/burst-prefix-operator:${version}"
producer_image="ghcr.io/burst-prefix/burst-prefix-producer:${version}"
system_ns=burst-prefix-system
app_ns=burst-prefix-e2e

log() { echo "e2e-kind: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

for tool in docker kind kubectl helm curl; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done

work="$(mktemp -d)"
port_forward=""
cleanup() {
    local status=$?
    if [[ -n "$port_forward" ]]; then kill "$port_forward" 2>/dev/null || true; fi
    if [[ $status -ne 0 ]]; then
        log "diagnostics:"
        kubectl get pods,bpp -A -o wide || true
        kubectl logs -n "$system_ns" deployment/burst-prefix --tail=50 || true
        kubectl describe bpp -n "$app_ns" || true
    fi
    if [[ "${KEEP_CLUSTER:-}" != 1 ]]; then
        kind delete cluster --name "$cluster" || true
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

log "creating kind cluster $cluster"
kind create cluster --name "$cluster" --wait 120s
kubectl config use-context "kind-$cluster"

log "building $operator_image and $producer_image"
docker build -f Dockerfile.operator -t "$operator_image" .
docker build -f Dockerfile.producer -t "$producer_image" .
docker pull "$echo_image"
kind load docker-image --name "$cluster" "$operator_image" "$producer_image" "$echo_image"

log "installing the chart"
helm install burst-prefix charts/burst-prefix --namespace "$system_ns" --create-namespace \
    --wait --timeout 3m

log "deploying the stand-in inference server and the policy"
kubectl create namespace "$app_ns"
kubectl apply -n "$app_ns" -f - <<YAML
apiVersion: apps/v1
kind: Deployment
metadata:
  name: vllm
spec:
  replicas: 2
  selector:
    matchLabels: {app: vllm}
  template:
    metadata:
      labels: {app: vllm}
    spec:
      containers:
        - name: server
          image: ${echo_image}
          imagePullPolicy: IfNotPresent
          args: ["-listen=:8000", "-text=stand-in for vLLM"]
          ports: [{name: http, containerPort: 8000}]
          readinessProbe:
            httpGet: {path: /, port: 8000}
            periodSeconds: 2
YAML
kubectl rollout status -n "$app_ns" deployment/vllm --timeout=2m
kubectl apply -n "$app_ns" -f examples/vllm-policy.yaml
kubectl wait -n "$app_ns" bpp/vllm --for=condition=Ready --timeout=3m
kubectl get bpp -n "$app_ns"
endpoints="$(kubectl get bpp vllm -n "$app_ns" -o jsonpath='{.status.endpoints}')"
[[ "$endpoints" == 2 ]] || die "the policy has $endpoints endpoints, expected 2"

log "sending a burst through a port-forward to svc/vllm-producer"
kubectl port-forward -n "$app_ns" svc/vllm-producer "$local_port:8080" >"$work/port-forward.log" 2>&1 &
port_forward=$!
for _ in $(seq 50); do
    curl -sf "http://127.0.0.1:$local_port/v1/endpoints" >/dev/null && break
    sleep 0.2
done
curl -sf "http://127.0.0.1:$local_port/v1/endpoints" >/dev/null || die "the producer does not answer"

body='{"model": "llama", "prompt": "Solve step by step: what is the sum of the first 100 positive integers? Show every step of the reasoning."}'
pids=()
for i in $(seq 8); do
    curl -sf -X POST "http://127.0.0.1:$local_port/v1/produce" \
        -H 'content-type: application/json' -d "$body" -o "$work/answer-$i.json" &
    pids+=("$!")
done
for pid in "${pids[@]}"; do
    wait "$pid" || die "a request of the burst failed"
done
# One distinct "assignedEndpoint":"<endpoint>" (none at all when they were not placed).
assigned="$(cat "$work"/answer-*.json | grep -o '"assignedEndpoint":"[^"]*"' | sort -u || true)"
[[ "$(grep -c . <<<"$assigned")" == 1 ]] || die "the burst was not co-located: $assigned"
[[ "$assigned" == *"\"$app_ns/vllm-"*"-rank-0\""* ]] || die "unexpected assignment: $assigned"
log "the burst of 8 was co-located on ${assigned#*:}"

# The operator's metrics, through the API server's service proxy.
kubectl get --raw "/api/v1/namespaces/$system_ns/services/http:burst-prefix-metrics:metrics/proxy/metrics" \
    >"$work/metrics.txt"
grep -q '^burst_prefix_operator_reconciliations_total' "$work/metrics.txt" || die "no operator metrics"
log "passed"
