# The project's one test command is `make test` (.ci/run calls it and nothing else).
CARGO ?= cargo

.PHONY: test lint unit demo bench

test: lint unit

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

unit:
	$(CARGO) test --workspace --locked

demo:
	$(CARGO) run --release --locked -p burst-prefix-producer -- demo

bench:
	$(CARGO) bench --locked -p burst-prefix-planner
