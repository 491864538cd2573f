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
# So that `tessera ...` works in another shell: a link in cargo's bin directory, which
# rustup puts on PATH (the build stays where it is, and a rebuild is picked up).
BIN_DIR="${CARGO_HOME:-$HOME/.cargo}/bin"
mkdir -p "$BIN_DIR"
ln -sf "$CARGO_TARGET_DIR/release/tessera" "$BIN_DIR/tessera"
case ":$PATH:" in
  *":$BIN_DIR:"*) ;;
  *) echo "dev.sh: add $BIN_DIR to PATH to type tessera in another shell" >&2 ;;
esac
exec "$CARGO_TARGET_DIR/release/tessera" dev "$@"
