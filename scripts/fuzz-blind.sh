#!/usr/bin/env bash
# The blind planted-bug experiment (fuzz/EXPERIMENT.md): plants one bug of scripts/plants/
# in a copy of the tracked files, builds the mutation_protocol fuzz target from it, and
# fuzzes from the generated seed inputs alone (none of the inputs found earlier, which
# would hand the fuzzer the answer), in-process, until the first failure or the time
# limit. Prints the time and executions it took, and where the failing input is.
#   ./scripts/fuzz-blind.sh PLANT [seconds (900)]
set -euo pipefail
cd "$(dirname "$0")/.."
PLANT="${1:?usage: fuzz-blind.sh PLANT [seconds]}"
SECS="${2:-900}"
PATCH="scripts/plants/$PLANT.patch"
[ -f "$PATCH" ] || { echo "fuzz-blind: no $PATCH" >&2; exit 2; }
CACHE="${TESSERA_CACHE:-$HOME/.cache/tessera}"
WORK="$(mktemp -d)"
SRC="$WORK/src"
mkdir -p "$SRC" "$WORK/corpus" "$WORK/found"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$SRC"
(cd "$SRC" && git apply "$OLDPWD/$PATCH")
(cd "$SRC/fuzz" && cargo fuzz build --sanitizer none --release -a \
  --target-dir "$CACHE/target-fuzz-plant" mutation_protocol >/dev/null 2>&1)
cp fuzz/corpus/mutation_protocol/seed-* "$WORK/corpus/"
BIN="$CACHE/target-fuzz-plant/x86_64-unknown-linux-gnu/release/mutation_protocol"
start=$(date +%s)
status=0
"$BIN" -max_total_time="$SECS" -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$WORK/found/" "$WORK/corpus" > "$WORK/fuzz.log" 2>&1 || status=$?
took=$(($(date +%s) - start))
runs=$(grep -E '^#[0-9]+' "$WORK/fuzz.log" | tail -n 1 | cut -d' ' -f1 | tr -d '#' | cut -f1)
found=$(ls "$WORK/found" 2>/dev/null | head -n 1)
if [ "$status" != 0 ] && [ -n "$found" ]; then
  echo "plant=$PLANT found after ${took}s and about ${runs:-?} executions: $(grep -m1 -A1 'panicked' "$WORK/fuzz.log" | tail -n 1 | cut -c1-200)"
  echo "input: $WORK/found/$found (log: $WORK/fuzz.log)"
else
  echo "plant=$PLANT not found in ${took}s (${runs:-?} executions; log: $WORK/fuzz.log)"
  exit 1
fi
