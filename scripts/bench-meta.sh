#!/usr/bin/env bash
# The metadata benchmark (bench/src/bin/meta.rs): `tessera bench meta` against one master
# and against a group of three replicas in the same run, then, on the group, shadow lag
# under load and the pause a client sees after kill -9 of the leader. Builds the release
# binary first. Arguments go to the benchmark, e.g. --files 5000 --kills 20
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# It measures insecure and secured clusters (mutual TLS, a CA of its own) in the same run.
CACHE="${TESSERA_CACHE:-$HOME/.cache/tessera}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
cargo build --release --locked -p tessera -p tessera-bench --bin tessera --bin meta
exec "$CARGO_TARGET_DIR/release/meta" --tessera "$CARGO_TARGET_DIR/release/tessera" \
  --dir "${TESSERA_BENCH_DIR:-$CARGO_TARGET_DIR/bench-meta}" "$@"
