#!/usr/bin/env bash
# Runs every check CI runs: formatting, lints, and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

# Compiled dependencies are kept outside the clone so CI runs on this machine reuse them.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tessera/target}"
export CARGO_TERM_COLOR=never

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
