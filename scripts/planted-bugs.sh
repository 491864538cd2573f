#!/usr/bin/env bash
# The planted-bug experiment: builds the scenario runner with each planted bug (cargo
# features of tessera-core, off in every normal build) and reports, per scenario, the
# first seed that catches it and the check that fired. Not part of CI: it must fail.
#   ./scripts/planted-bugs.sh [max-seeds]      (BUGS=... SCENARIOS=... narrow it down)
set -uo pipefail
cd "$(dirname "$0")/.."
MAX="${1:-30}"
CACHE="${TESSERA_CACHE:-$HOME/.cache/tessera}"
SIM_TARGET="$CACHE/target-madsim"
OUT="$CACHE/planted"
mkdir -p "$OUT"
BUGS="${BUGS:-plant-no-version-bump plant-stale-location plant-gc-live-chunk plant-early-ack plant-skip-read-verify plant-early-lease plant-no-padding}"
SCENARIOS="${SCENARIOS:-steady chunkserver-crash partition master-restart disk-corruption gc concurrent-writers record-append stale-replica scrub}"
for bug in $BUGS; do
  RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR="$SIM_TARGET" \
    cargo build --quiet --release -p tessera-scenarios --features "$bug" || exit 1
  cp "$SIM_TARGET/release/tessera-scenarios" "$OUT/runner-$bug"
done
# Leave the normal runner built, as CI expects it.
RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR="$SIM_TARGET" cargo build --quiet --release -p tessera-scenarios
for bug in $BUGS; do
  for s in $SCENARIOS; do
    caught=""
    for seed in $(seq 1 "$MAX"); do
      line=$("$OUT/runner-$bug" run "$s" --seed "$seed" 2>/dev/null | grep -m1 "violated:" || true)
      if [ -n "$line" ]; then
        caught="caught at seed $seed (${seed} seeds): ${line#*violated: }"
        break
      fi
    done
    echo "bug=$bug scenario=$s ${caught:-not caught in $MAX seeds}" | cut -c1-260
  done
done
