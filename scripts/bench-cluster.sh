#!/usr/bin/env bash
# The cluster benchmark (bench/src/bin/cluster.rs): put and get of a large file on a
# master and three chunkservers on loopback, beside dd and loopback-TCP baselines taken
# in the same run. Builds the release binary first. Arguments go to the benchmark, e.g.
# --size-mib 1024 --rounds 3 --dir /path/on/the/disk/to/measure
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Its rounds run insecure clusters; then secured ones (mutual TLS, chunk capabilities)
# beside insecure ones in turn, for the cost of authentication (`--security-cost 0`
# leaves that out). Each process is told which it is.
CACHE="${TESSERA_CACHE:-$HOME/.cache/tessera}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
cargo build --release --locked -p tessera -p tessera-bench --bin tessera --bin cluster
exec "$CARGO_TARGET_DIR/release/cluster" --tessera "$CARGO_TARGET_DIR/release/tessera" \
  --dir "${TESSERA_BENCH_DIR:-$CARGO_TARGET_DIR/bench-cluster}" "$@"
