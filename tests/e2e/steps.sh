#!/usr/bin/env bash
# The end-to-end steps, on whatever cluster KUBECONFIG names: the node of the test harness
# (tests/e2e_node.rs, `make e2e-node`) or a kind cluster (tests/e2e/kind.sh). Both load the
# images first; nothing is pulled (pullPolicy Never).
#
# 1. helm install the chart with the given images; the operator runs with the chart's
#    ServiceAccount and becomes Ready.
# 2. Stub inference pods (3) and a policy selecting them; the producer Deployment the operator
#    runs becomes Ready (its probes pass) and its ConfigMap lists the pods.
# 3. A burst of 6 prompts x 8 samples to the producer's Service (through kube-apiserver's
#    service proxy): each prompt's samples are placed together, on a current pod.
# 4. Delete the producer pod: the Deployment replaces it, the new one reads its ConfigMap with
#    its own ServiceAccount token and plans the next burst on the current pods. Scale the stub
#    pods 3 -> 4: the new one becomes an endpoint, in the ConfigMap and in the producer.
# 5. The policy switched to 2 active-active producers (both Ready), then, under a steady load
#    (a completion every 150 ms through the Service), helm upgrade to a new producer image: the
#    operator rolls every producer (surge 1, none unavailable). Every request gets 200, some are
#    sent during the roll, and a producer pod and a Service endpoint are Ready at every sample.
# 6. helm upgrade with producer.networkPolicy.enabled: the operator makes the producer's
#    NetworkPolicy, which selects the producer pods and opens its ports to the policy's namespace
#    only. Probe pods (the producer image as a one-endpoint proxy) in the policy's namespace and
#    in another send a request to the producer pod's API port: the first must get through; the
#    second must be dropped where the network plugin enforces NetworkPolicy, and gets through
#    where it does not (the CNI bridge plugin of the test harness's node): the caller says which
#    to expect, and the step fails when the cluster does otherwise.
# 7. helm uninstall, then delete the policy's namespaces: only the CRD is left.
#
# Environment (all required but the last three):
#   OPERATOR_IMAGE, PRODUCER_IMAGE, STUB_IMAGE   image references, already on the cluster's nodes
#   PRODUCER_IMAGE_NEXT                           a second reference to a producer image on the
#                                                 nodes (the same image under another tag will
#                                                 do): what step 5 rolls the producers to
#   E2E_NETWORK_POLICY_ENFORCED                   true or false: whether the cluster's network
#                                                 plugin enforces NetworkPolicy
#   KUBECTL, HELM                                 the clients (default: kubectl, helm)
#   E2E_WORK                                      a scratch directory (default: a new temp dir)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

: "${OPERATOR_IMAGE:?}" "${PRODUCER_IMAGE:?}" "${PRODUCER_IMAGE_NEXT:?}" "${STUB_IMAGE:?}" "${E2E_NETWORK_POLICY_ENFORCED:?}"
[[ "$E2E_NETWORK_POLICY_ENFORCED" == true || "$E2E_NETWORK_POLICY_ENFORCED" == false ]] ||
    { echo "E2E_NETWORK_POLICY_ENFORCED must be true or false" >&2; exit 2; }
kubectl="${KUBECTL:-kubectl}"
helm="${HELM:-helm}"
work="${E2E_WORK:-$(mktemp -d)}"
system_ns=burst-prefix-system
app_ns=burst-prefix-e2e
other_ns=burst-prefix-e2e-other
release=burst-prefix
producer=vllm-producer
prompts=6
samples=8

step_start=$SECONDS
log() { echo "e2e: [$((SECONDS - step_start))s] $*" >&2; }
die() { log "FAILED: $*"; exit 1; }
k() { "$kubectl" "$@"; }

proxy_pid=""
diagnostics() {
    local status=$?
    if [[ -n "$proxy_pid" ]]; then kill "$proxy_pid" 2>/dev/null || true; fi
    if [[ $status -ne 0 ]]; then
        log "diagnostics:"
        k get nodes,pods,deployments,services,endpointslices -A -o wide || true
        k get bpp -A -o yaml || true
        k get networkpolicies -A -o yaml || true
        k get events -A --sort-by=.lastTimestamp | tail -40 || true
        k logs -n "$system_ns" "deployment/$release" --tail=60 || true
        k logs -n "$app_ns" "deployment/$producer" --tail=60 || true
    fi
    exit "$status"
}
trap diagnostics EXIT

# repository and tag of an image reference (the tag after the last ':' that follows the last '/').
repository() { local ref="$1"; [[ "${ref##*/}" == *:* ]] && echo "${ref%:*}" || echo "$ref"; }
tag() { local ref="$1"; [[ "${ref##*/}" == *:* ]] && echo "${ref##*:}" || echo latest; }

# --- 1. the chart --------------------------------------------------------------------------------
log "1. helm install $release (operator $OPERATOR_IMAGE, producer $PRODUCER_IMAGE)"
"$helm" install "$release" charts/burst-prefix --namespace "$system_ns" --create-namespace \
    --set image.repository="$(repository "$OPERATOR_IMAGE")" --set image.tag="$(tag "$OPERATOR_IMAGE")" \
    --set image.pullPolicy=Never \
    --set producer.image.repository="$(repository "$PRODUCER_IMAGE")" \
    --set producer.image.tag="$(tag "$PRODUCER_IMAGE")" --set producer.image.pullPolicy=Never \
    --wait --timeout 4m
operator_pod="$(k get pods -n "$system_ns" -l app.kubernetes.io/name=burst-prefix \
    -o jsonpath='{.items[0].metadata.name}')"
account="$(k get pod -n "$system_ns" "$operator_pod" -o jsonpath='{.spec.serviceAccountName}')"
[[ "$account" == "$release" ]] || die "the operator runs as ServiceAccount '$account', not '$release'"
k wait -n "$system_ns" "pod/$operator_pod" --for=condition=Ready --timeout=2m
log "the operator pod $operator_pod is Ready, as ServiceAccount $account"

# --- 2. stub inference pods, the policy, the producer ---------------------------------------------
log "2. stub inference pods ($STUB_IMAGE) and a policy"
k create namespace "$app_ns"
k apply -n "$app_ns" -f - <<YAML
apiVersion: apps/v1
kind: Deployment
metadata:
  name: vllm
spec:
  replicas: 3
  selector:
    matchLabels: {app: vllm}
  template:
    metadata:
      labels: {app: vllm}
    spec:
      automountServiceAccountToken: false
      securityContext:
        runAsNonRoot: true
        seccompProfile: {type: RuntimeDefault}
      containers:
        - name: server
          image: ${STUB_IMAGE}
          imagePullPolicy: Never
          ports: [{name: http, containerPort: 8000}]
          readinessProbe:
            httpGet: {path: /healthz, port: 8000}
            periodSeconds: 2
          securityContext:
            readOnlyRootFilesystem: true
            allowPrivilegeEscalation: false
            capabilities: {drop: ["ALL"]}
YAML
k rollout status -n "$app_ns" deployment/vllm --timeout=3m
# The example policy, with a window long enough that one burst through the API server's
# service proxy lands in one window on a slow machine, balanced by requests: the test checks
# that a burst lands together through the cluster's path, a rule of that mode (the time cost,
# the default, may split a short prompt's samples when that answers them sooner).
sed 's/^  windowDurationMs: .*/  windowDurationMs: 1000\n  balanceBy: requests/' examples/vllm-policy.yaml | k apply -n "$app_ns" -f -
k wait -n "$app_ns" bpp/vllm --for=condition=Ready --timeout=3m
k rollout status -n "$app_ns" "deployment/$producer" --timeout=3m
# The endpoint picker serves TLS by default (appProtocol http2), and the pod has the time to
# drain: a 1 s window + the default 120 s drain + the 10 s shutdown timeout + 5 s, in seconds.
epp_protocol="$(k get service -n "$app_ns" "$producer" -o jsonpath='{.spec.ports[?(@.name=="epp")].appProtocol}')"
[[ "$epp_protocol" == http2 ]] || die "the epp port's appProtocol is '$epp_protocol', not http2"
grace="$(k get deployment -n "$app_ns" "$producer" -o jsonpath='{.spec.template.spec.terminationGracePeriodSeconds}')"
[[ "$grace" == 136 ]] || die "the producer pods' terminationGracePeriodSeconds is '$grace', not 136"

# The ConfigMap lists exactly the Running stub pods (<namespace>/<pod>-rank-0 at <podIP>:8000).
check_endpoints() { # <expected count>
    local want="$1" pods config
    pods="$(k get pods -n "$app_ns" -l app=vllm --field-selector=status.phase=Running \
        -o jsonpath='{range .items[*]}{.metadata.name} {.status.podIP}{"\n"}{end}')"
    config="$(k get configmap -n "$app_ns" "$producer" -o jsonpath='{.data.config\.yaml}')"
    [[ "$(grep -c . <<<"$pods")" == "$want" ]] || return 1
    [[ "$(grep -c 'rank-0' <<<"$config")" == "$want" ]] || return 1
    local name ip
    while read -r name ip; do
        grep -q "$app_ns/$name-rank-0" <<<"$config" || return 1
        grep -q "$ip:8000" <<<"$config" || return 1
    done <<<"$pods"
    [[ "$(k get bpp -n "$app_ns" vllm -o jsonpath='{.status.endpoints}')" == "$want" ]]
}
eventually() { # <seconds> <what> <command...>
    local seconds="$1" what="$2"
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@"; do
        ((SECONDS < deadline)) || die "$what (after ${seconds}s)"
        sleep 1
    done
}
eventually 60 "the producer's ConfigMap does not list the 3 stub pods" check_endpoints 3
log "the producer is Ready and its ConfigMap lists the 3 stub pods"

# --- 3. a burst -----------------------------------------------------------------------------------
# kubectl proxy: the API server's service proxy with the kubeconfig's credentials, whatever they
# are (a token here, client certificates on kind).
"$kubectl" proxy --port=0 >"$work/proxy.log" 2>&1 &
proxy_pid=$!
eventually 20 "kubectl proxy did not start" grep -q 'Starting to serve on' "$work/proxy.log"
proxy="http://$(sed -n 's/^Starting to serve on //p' "$work/proxy.log")"
service_url="$proxy/api/v1/namespaces/$app_ns/services/http:$producer:8080/proxy"

producer_answers() { curl -sf "$service_url/v1/endpoints" >/dev/null; }

# burst <name>: 6 prompts x 8 samples, all at once; each prompt's samples on one current pod.
burst() {
    local name="$1" dir="$work/$1"
    mkdir -p "$dir"
    : >"$dir/curl.config"
    local p s
    for p in $(seq "$prompts"); do
        # Distinct long prompts (several 64-token blocks each), shared by their samples.
        local text="Prompt $p of burst $name: $(printf 'solve the puzzle number %s step by step; ' $(seq 40) | sed "s/puzzle/puzzle-$p/g")"
        printf '{"model": "stub", "prompt": "%s", "n": 1}' "$text" >"$dir/prompt-$p.json"
        for s in $(seq "$samples"); do
            cat >>"$dir/curl.config" <<CONFIG
next
url = "$service_url/v1/produce"
request = "POST"
header = "content-type: application/json"
data-binary = "@$dir/prompt-$p.json"
output = "$dir/answer-$p-$s.json"
fail
CONFIG
        done
    done
    sed -i '1d' "$dir/curl.config" # no `next` before the first request
    curl -s --parallel --parallel-immediate --parallel-max $((prompts * samples)) \
        --config "$dir/curl.config" || die "a request of burst $name failed"
    local pods
    pods="$(k get pods -n "$app_ns" -l app=vllm -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')"
    for p in $(seq "$prompts"); do
        local assigned
        assigned="$(cat "$dir"/answer-"$p"-*.json | jq -r .assignedEndpoint | sort -u)"
        [[ "$(grep -c . <<<"$assigned")" == 1 && "$assigned" != null ]] ||
            die "burst $name: the samples of prompt $p went to: $(tr '\n' ' ' <<<"$assigned")"
        grep -qx "${assigned#"$app_ns/"}" <<<"$(sed 's/$/-rank-0/' <<<"$pods")" ||
            die "burst $name: prompt $p was placed on $assigned, which is not a current stub pod"
        echo "$p $assigned"
    done >"$dir/placement.txt"
    local windows
    windows="$(cat "$dir"/answer-*.json | jq -r '"\(.window.id) (size \(.window.size), sealed by \(.window.sealedBy))"' | sort | uniq -c)"
    log "burst $name: every prompt's $samples samples co-located: $(awk '{print $1 "->" $2}' "$dir/placement.txt" | tr '\n' ' ')"
    log "burst $name: windows: $(tr -s ' \n' ' ' <<<"$windows")"
}

log "3. a burst of $prompts prompts x $samples samples"
eventually 30 "the producer's Service does not answer" producer_answers
burst first

# --- 4. the producer pod replaced, the stub pods scaled ------------------------------------------
selector="$(k get deployment -n "$app_ns" "$producer" -o jsonpath='{.spec.selector.matchLabels}' |
    jq -r 'to_entries | map("\(.key)=\(.value)") | join(",")')"
old_pod="$(k get pods -n "$app_ns" -l "$selector" -o jsonpath='{.items[0].metadata.name}')"
log "4. deleting the producer pod $old_pod"
k delete pod -n "$app_ns" "$old_pod" --wait=true
new_pod_ready() {
    local name
    name="$(k get pods -n "$app_ns" -l "$selector" \
        -o jsonpath='{range .items[?(@.status.containerStatuses[0].ready==true)]}{.metadata.name}{"\n"}{end}')"
    [[ -n "$name" && "$name" != *"$old_pod"* ]]
}
eventually 120 "no new producer pod became Ready" new_pod_ready
new_pod="$(k get pods -n "$app_ns" -l "$selector" -o jsonpath='{.items[0].metadata.name}')"
producer_account="$(k get pod -n "$app_ns" "$new_pod" -o jsonpath='{.spec.serviceAccountName}')"
[[ "$producer_account" == "$producer" ]] || die "the producer runs as '$producer_account', not '$producer'"
k logs -n "$app_ns" "$new_pod" >"$work/new-producer.log"
log "the Deployment replaced it with $new_pod (ServiceAccount $producer_account), Ready"
eventually 30 "the new producer's Service does not answer" producer_answers
burst second

log "scaling the stub pods 3 -> 4"
k scale -n "$app_ns" deployment/vllm --replicas=4
k rollout status -n "$app_ns" deployment/vllm --timeout=3m
eventually 60 "the producer's ConfigMap does not list the 4 stub pods" check_endpoints 4
newest="$(k get pods -n "$app_ns" -l app=vllm --sort-by=.metadata.creationTimestamp \
    -o jsonpath='{.items[-1:].metadata.name}')"
# The whole answer first, then matched: `curl | grep -q` under pipefail fails when grep exits
# at its first match and curl cannot write the rest.
in_producer() {
    local endpoints
    endpoints="$(curl -sf "$service_url/v1/endpoints")" && grep -q "$app_ns/$newest-rank-0" <<<"$endpoints"
}
eventually 30 "the producer does not list the new pod $newest" in_producer
log "the new stub pod $newest is an endpoint: in the ConfigMap and in the producer"

# Liveness held too: no container of the operator, the producer or the stub pods restarted.
restarts="$(k get pods -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {range .status.containerStatuses[*]}{.restartCount} {end}{"\n"}{end}' |
    grep -E "^($system_ns|$app_ns)/" | awk '{ for (i = 2; i <= NF; i++) if ($i != 0) print $1 }')"
[[ -z "$restarts" ]] || die "containers restarted: $restarts"

# --- 5. a rolling upgrade of active-active producers under a steady load ---------------------------
# Two producers that both serve (ha: activeActive), then `helm upgrade` to a new producer image
# (the same image under a second name, already on the nodes): the operator rolls every producer
# (surge 1, none unavailable) while a steady load of completions goes through the Service.
log "5. two active-active producers, then helm upgrade to $PRODUCER_IMAGE_NEXT under a steady load"
k patch bpp -n "$app_ns" vllm --type merge -p '{"spec": {"producer": {"replicas": 2, "ha": "activeActive"}}}'
# producers_settled <image>: exactly 2 producer pods, none terminating, all running <image>, all Ready.
producers_settled() {
    k get pods -n "$app_ns" -l "$selector" -o json | jq -e --arg image "$1" '
        (.items | length) == 2 and all(.items[];
            .metadata.deletionTimestamp == null and .spec.containers[0].image == $image
            and any(.status.conditions[]?; .type == "Ready" and .status == "True"))' >/dev/null
}
eventually 180 "the 2 active-active producers on $PRODUCER_IMAGE did not become Ready" producers_settled "$PRODUCER_IMAGE"
before_roll="$(k get pods -n "$app_ns" -l "$selector" -o jsonpath='{.items[*].metadata.name}')"
log "2 producers Ready: $before_roll"
eventually 30 "the producers' Service does not answer" producer_answers

# The load: one completion every 150 ms, each in the background with a 15 s timeout, for at most
# $load_max requests or $load_seconds; SIGTERM stops it from sending more, and it waits for the
# ones in flight. Each request appends "<n> <start> <end> <HTTP status>" to statuses.txt.
roll="$work/roll"
mkdir -p "$roll"
load_max=2000
load_seconds=300
steady_load() {
    local stopping="" n=0 deadline=$((SECONDS + load_seconds))
    trap 'stopping=1' TERM
    while [[ -z "$stopping" ]] && ((n < load_max && SECONDS < deadline)); do
        n=$((n + 1))
        (
            start="$(date +%s.%N)"
            status="$(curl -s -m 15 -o "$roll/answer-$n" -w '%{http_code}' -X POST \
                -H 'content-type: application/json' \
                -d "{\"model\": \"stub\", \"prompt\": \"rolling upgrade request $n\", \"max_tokens\": 4}" \
                "$service_url/v1/completions")" || true
            echo "$n $start $(date +%s.%N) $status" >>"$roll/statuses.txt"
        ) &
        sleep 0.15
    done
    wait
}
: >"$roll/statuses.txt"
steady_load &
load_pid=$!
sleep 3
# Each old producer's log to its end: what it had in flight when the roll stopped it, and how
# long its drain took.
drain_log_pids=()
for pod in $before_roll; do
    k logs -f -n "$app_ns" "$pod" >"$roll/$pod.log" 2>&1 &
    drain_log_pids+=($!)
done
roll_start="$(date +%s.%N)"
"$helm" upgrade "$release" charts/burst-prefix --namespace "$system_ns" --reuse-values \
    --set producer.image.repository="$(repository "$PRODUCER_IMAGE_NEXT")" \
    --set producer.image.tag="$(tag "$PRODUCER_IMAGE_NEXT")" --wait --timeout 4m >"$roll/helm.log" 2>&1 &
helm_pid=$!
# Until every producer runs the new image and is Ready (at most 240 s), once a second: how many
# producer pods are Ready (and not terminating), and how many of the Service's endpoints are
# ready; at least one of each at every sample. Each sample is kept in samples.txt.
samples=0
roll_deadline=$((SECONDS + 240))
until producers_settled "$PRODUCER_IMAGE_NEXT"; do
    ((SECONDS < roll_deadline)) || die "the producers did not roll to $PRODUCER_IMAGE_NEXT within 240s: $(cat "$roll/helm.log")"
    sample="$(k get pods,endpointslices -n "$app_ns" -o json | jq -r --arg producer "$producer" '
        [.items[] | select(.kind == "Pod" and (.metadata.name | startswith($producer + "-")))] as $pods
        | ($pods | map(select(.metadata.deletionTimestamp == null
            and any(.status.conditions[]?; .type == "Ready" and .status == "True"))) | length) as $ready
        | ([.items[] | select(.kind == "EndpointSlice"
            and .metadata.labels["kubernetes.io/service-name"] == $producer)
            | .endpoints[]? | select(.conditions.ready == true)] | length) as $endpoints
        | "\($ready) \($endpoints) \($pods | map("\(.metadata.name)=\(.status.podIP // "-")/\(.spec.containers[0].image | split(":") | last)\(if .metadata.deletionTimestamp then "/terminating" else "" end)") | join(" "))"')"
    echo "$(date +%s.%N) $sample" >>"$roll/samples.txt"
    samples=$((samples + 1))
    read -r ready_pods ready_endpoints _ <<<"$sample"
    ((ready_pods >= 1 && ready_endpoints >= 1)) ||
        die "during the roll no producer was Ready: $ready_pods Ready pods, $ready_endpoints ready endpoints ($sample)"
    sleep 1
done
roll_end="$(date +%s.%N)"
wait "$helm_pid" || die "helm upgrade failed: $(cat "$roll/helm.log")"
sleep 3
kill -TERM "$load_pid"
wait "$load_pid" || true
after_roll="$(k get pods -n "$app_ns" -l "$selector" -o jsonpath='{.items[*].metadata.name}')"
# The old pods are gone, so their logs have ended; a follower still running is stopped.
for pid in "${drain_log_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
wait "${drain_log_pids[@]}" 2>/dev/null || true
drains=""
for pod in $before_roll; do
    [[ " $after_roll " != *" $pod "* ]] || die "the producer pod $pod was not replaced by the roll"
    drains+="$pod: $({ jq -rR 'fromjson? | select(.message? // "" | startswith("draining") or startswith("drained") or startswith("requests still in flight"))
        | if .message | startswith("draining") then "\(.in_flight) in flight at SIGTERM" else "\(.message | split(":")[0]) after \(.seconds // "?")s" end' \
        "$roll/$pod.log" 2>/dev/null || true; } | paste -sd, -); "
done
log "the old producers' drains: $drains"
roll_seconds="$(awk -v a="$roll_start" -v b="$roll_end" 'BEGIN { printf "%.1f", b - a }')"
# Every request by when it started: before the upgrade, during the roll, after it.
read -r sent before during after failed <<<"$(awk -v a="$roll_start" -v b="$roll_end" '
    { n++; if ($2 < a) x++; else if ($2 <= b) y++; else z++; if ($4 != 200) f++ }
    END { print n + 0, x + 0, y + 0, z + 0, f + 0 }' "$roll/statuses.txt")"
log "the roll took ${roll_seconds}s ($samples samples, each with a Ready producer; now $after_roll); requests: $sent sent, $before before the upgrade, $during during the roll, $after after; $failed failed"
if ((failed > 0)); then
    awk '$4 != 200' "$roll/statuses.txt" | while read -r n start end status; do
        log "request $n (started $start, ended $end): $status $(head -c 400 "$roll/answer-$n" 2>/dev/null)"
    done
    log "samples (time, Ready pods, ready endpoints, pods):"
    cat "$roll/samples.txt" >&2
    die "$failed of $sent requests failed during a rolling upgrade"
fi
((during >= 10)) || die "only $during requests were sent during the roll: it shows nothing"
restarts="$(k get pods -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {range .status.containerStatuses[*]}{.restartCount} {end}{"\n"}{end}' |
    grep -E "^($system_ns|$app_ns)/" | awk '{ for (i = 2; i <= NF; i++) if ($i != 0) print $1 }')"
[[ -z "$restarts" ]] || die "containers restarted: $restarts"

# --- 6. the producer's NetworkPolicy --------------------------------------------------------------
log "6. helm upgrade --set producer.networkPolicy.enabled=true"
"$helm" upgrade "$release" charts/burst-prefix --namespace "$system_ns" --reuse-values \
    --set producer.networkPolicy.enabled=true --wait --timeout 4m
network_policy_made() { k get networkpolicy -n "$app_ns" "$producer" -o json >"$work/networkpolicy.json" 2>/dev/null; }
eventually 60 "the operator made no NetworkPolicy $producer" network_policy_made
np_selector="$(jq -c '.spec.podSelector' "$work/networkpolicy.json")"
deployment_selector="$(k get deployment -n "$app_ns" "$producer" -o json | jq -c '.spec.selector')"
[[ "$np_selector" == "$deployment_selector" ]] ||
    die "the NetworkPolicy selects $np_selector, the producer Deployment $deployment_selector"
np_labels="$(jq -r '.spec.podSelector.matchLabels | to_entries | map("\(.key)=\(.value)") | join(",")' "$work/networkpolicy.json")"
selected="$(k get pods -n "$app_ns" -l "$np_labels" -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')"
producer_pods="$(k get pods -n "$app_ns" -l "$selector" -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')"
[[ "$(sort <<<"$selected")" == "$(sort <<<"$producer_pods")" ]] ||
    die "the NetworkPolicy's selector picks '$selected', not the producer pods $producer_pods"
# The chart's defaults: each port (API 8080, endpoint picker 9002, admin 9090) open to the
# policy's own namespace, ingress only.
rules="$(jq -c '[.spec.policyTypes, [.spec.ingress[] | [.ports[].port, .from]]]' "$work/networkpolicy.json")"
want='[["Ingress"],[[8080,[{"podSelector":{}}]],[9002,[{"podSelector":{}}]],[9090,[{"podSelector":{}}]]]]'
[[ "$rules" == "$want" ]] || die "the NetworkPolicy says $rules, not $want"
log "NetworkPolicy $producer selects the producer pods $(tr '\n' ' ' <<<"$producer_pods"); ports 8080, 9002, 9090 from the pods of $app_ns only"

producer_ip="$(k get pod -n "$app_ns" "$(head -1 <<<"$producer_pods")" -o jsonpath='{.status.podIP}')"
k create namespace "$other_ns"
# probe_pod <namespace> <name> <address>: the producer image serving a config whose one
# endpoint is <address>, so that a request through it is a connection from that namespace.
probe_pod() {
    k apply -n "$1" -f - <<YAML
apiVersion: v1
kind: ConfigMap
metadata:
  name: $2
data:
  config.yaml: |
    endpoints:
      - {id: target, address: "$3"}
---
apiVersion: v1
kind: Pod
metadata:
  name: $2
spec:
  automountServiceAccountToken: false
  securityContext:
    runAsNonRoot: true
    seccompProfile: {type: RuntimeDefault}
  containers:
    - name: probe
      image: ${PRODUCER_IMAGE}
      imagePullPolicy: Never
      args: [serve, --config, /etc/probe/config.yaml]
      volumeMounts: [{name: config, mountPath: /etc/probe}]
      readinessProbe:
        httpGet: {path: /readyz, port: 9090}
        periodSeconds: 2
      securityContext:
        readOnlyRootFilesystem: true
        allowPrivilegeEscalation: false
        capabilities: {drop: ["ALL"]}
  volumes:
    - name: config
      configMap: {name: $2}
YAML
}
probe_pod "$app_ns" np-probe "$producer_ip:8080"
probe_pod "$other_ns" np-probe "$producer_ip:8080"
# A port nothing listens on: shows what the probe answers when it cannot connect.
probe_pod "$other_ns" np-probe-closed "$producer_ip:1"
k wait -n "$app_ns" pod/np-probe --for=condition=Ready --timeout=2m
k wait -n "$other_ns" pod/np-probe pod/np-probe-closed --for=condition=Ready --timeout=2m
# probe <namespace> <pod>: the HTTP status of one completion through that probe pod: 200 when
# it reached the producer (which placed it on a stub pod), 502 or 504 when it could not connect.
probe() {
    curl -s -o "$work/probe-$1-$2.json" -w '%{http_code}' -X POST -H 'content-type: application/json' \
        -d '{"model": "stub", "prompt": "a network policy probe", "max_tokens": 1}' \
        "$proxy/api/v1/namespaces/$1/pods/http:$2:8080/proxy/v1/completions"
}
closed="$(probe "$other_ns" np-probe-closed)"
[[ "$closed" == 502 || "$closed" == 504 ]] ||
    die "through a probe whose endpoint is a closed port the answer was $closed, not 502 or 504: $(cat "$work/probe-$other_ns-np-probe-closed.json")"
allowed="$(probe "$app_ns" np-probe)"
[[ "$allowed" == 200 ]] || die "from $app_ns, which the NetworkPolicy admits, the producer answered $allowed: $(cat "$work/probe-$app_ns-np-probe.json")"
other="$(probe "$other_ns" np-probe)"
if [[ "$E2E_NETWORK_POLICY_ENFORCED" == true ]]; then
    [[ "$other" == 502 || "$other" == 504 ]] ||
        die "from $other_ns, which the NetworkPolicy does not admit, the probe got $other: the policy is not enforced"
    log "enforced: $app_ns reached the producer's API port (200), $other_ns did not ($other, as a closed port: $closed)"
else
    [[ "$other" == 200 ]] ||
        die "from $other_ns the probe got $other, but this cluster was said not to enforce NetworkPolicy: if it does now, set E2E_NETWORK_POLICY_ENFORCED=true and update docs/behaviour.md §9"
    log "NOT enforced here: $other_ns also reached the producer's API port (200), as $app_ns did (a closed port answers $closed); the NetworkPolicy is in place but nothing on this node applies it"
fi

# --- 7. uninstall ---------------------------------------------------------------------------------
log "7. helm uninstall"
kill "$proxy_pid" 2>/dev/null || true
proxy_pid=""
"$helm" uninstall "$release" --namespace "$system_ns" --wait --timeout 3m
k delete namespace "$other_ns" --wait=true --timeout=3m
k delete namespace "$app_ns" --wait=true --timeout=3m
k delete namespace "$system_ns" --wait=true --timeout=3m
crd="$(k get crd -o name | grep burstprefix || true)"
[[ "$crd" == "customresourcedefinition.apiextensions.k8s.io/burstprefixpolicies.burstprefix.io" ]] ||
    die "after uninstall the CRDs are: $crd"
# Nothing of the release is left anywhere: no object labelled with it, no cluster-scoped RBAC.
left="$(k get clusterroles,clusterrolebindings,validatingwebhookconfigurations,mutatingwebhookconfigurations \
    -l "app.kubernetes.io/instance=$release" -o name 2>/dev/null || true)"
[[ -z "$left" ]] || die "left behind after uninstall: $left"
left="$(k get clusterroles,clusterrolebindings -o name | grep "$release" || true)"
[[ -z "$left" ]] || die "left behind after uninstall: $left"
log "only the CRD is left ($crd)"
log "passed"
