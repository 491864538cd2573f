#!/usr/bin/env bash
# Runs every cargo-fuzz target for a while: ./scripts/fuzz.sh [seconds per target] [target...]
# TESSERA_FUZZ_SEED=N fixes libFuzzer's random seed (printed either way): a run repeated
# with it starts with the same mutations, though not every later one (the coverage an
# input reaches can differ between processes where a checker walks a hash map, and
# coverage steers the fuzzer). TESSERA_FUZZ_RUNS=N stops each target after N inputs,
# before its time is up.
# New inputs the fuzzer finds go to a scratch copy of the corpus (printed), never into
# fuzz/corpus/; a crash leaves its input in fuzz/artifacts/<target>/ and fails the run.
# Once the bug is fixed, add that input to fuzz/corpus/<target>/ so `cargo test` keeps
# trying it. cargo-fuzz runs on the stable toolchain here with `--sanitizer none`.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-60}"
shift || true
# libFuzzer reads a non-number as 0, which means "no limit": refuse anything else.
if ! [[ "$SECS" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: the first argument is the seconds per target (a whole number above 0), not '$SECS'" >&2
  exit 2
fi
CACHE="${TESSERA_CACHE:-$HOME/.cache/tessera}"
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz --version 0.13.2 --locked --quiet
fi
TARGETS="${*:-$(cargo fuzz list --fuzz-dir fuzz)}"
SCRATCH="$(mktemp -d)"
SEED="${TESSERA_FUZZ_SEED:-$(( (RANDOM << 15 | RANDOM) + 1 ))}"
RUNS=()
if [ -n "${TESSERA_FUZZ_RUNS:-}" ]; then
  RUNS=(-runs="$TESSERA_FUZZ_RUNS")
fi
echo "== fuzz seed $SEED (repeat: TESSERA_FUZZ_SEED=$SEED${TESSERA_FUZZ_RUNS:+ TESSERA_FUZZ_RUNS=$TESSERA_FUZZ_RUNS} ./scripts/fuzz.sh $SECS $TARGETS)"
for t in $TARGETS; do
  mkdir -p "$SCRATCH/$t"
  echo "== fuzz $t for ${SECS}s (new inputs in $SCRATCH/$t)"
  status=0
  # -a keeps debug assertions and overflow checks in the optimized build, as the corpus
  # replay under `cargo test` has them. (Without a sanitizer libFuzzer cannot hook
  # malloc, so only the resident-memory limit applies.)
  cargo fuzz run --fuzz-dir fuzz --sanitizer none --release -a --target-dir "$CACHE/target-fuzz" \
    "$t" "$SCRATCH/$t" "fuzz/corpus/$t" -- -max_total_time="$SECS" -rss_limit_mb=2048 \
    -seed="$SEED" "${RUNS[@]}" -print_final_stats=1 > "$SCRATCH/$t.log" 2>&1 || status=$?
  # libFuzzer's progress lines are left in the log; its verdict and figures are shown.
  grep -E '^(stat::|Done |INFO: Running with|==[0-9]+== ERROR|SUMMARY|thread .* panicked|.*Test unit written|error)' \
    "$SCRATCH/$t.log" || true
  if [ "$status" != 0 ]; then
    tail -n 40 "$SCRATCH/$t.log" >&2
    echo "FAILED: fuzz target $t (its input is in fuzz/artifacts/$t/)" >&2
    exit 1
  fi
done
