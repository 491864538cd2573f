#!/usr/bin/env bash
# Starts a whole Tessera cluster on this machine (`tessera dev`): installs what the build
# needs, builds the release binary, and runs it. Extra arguments go to `tessera dev`
# (try --help). Ctrl-C stops the cluster; run this again and the data is still there.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
CACHE="${TESSERA_CACHE:-$HOME/.cache/tessera}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
cargo build --release --locked -p tessera
exec "$CARGO_TARGET_DIR/release/tessera" dev "$@"
