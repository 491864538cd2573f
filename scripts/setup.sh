#!/usr/bin/env bash
# Installs what building and testing Tessera needs on a fresh machine. Idempotent.
# The protobuf compiler is not needed: protox (a Rust crate) compiles the .proto files.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
# The toolchain and its components come from rust-toolchain.toml.
rustup show active-toolchain >/dev/null
rustup component add rustfmt clippy >/dev/null 2>&1 || true
