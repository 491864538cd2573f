#!/usr/bin/env bash
# Runs every check CI runs: formatting, lints, the unit and property tests, and the
# simulator's seeded failure scenarios with a determinism check.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

# Compiled dependencies are kept outside the clone so CI runs on this machine reuse them.
# The simulator builds with --cfg madsim, so it gets a target directory of its own.
CACHE="${TESSERA_CACHE:-$HOME/.cache/tessera}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
SIM_TARGET="$CACHE/target-madsim"
export CARGO_TERM_COLOR=never
# Each stage's heading says how long the run has taken so far: CI has 90 minutes.
stage() { echo "== $* [$((SECONDS / 60))m$((SECONDS % 60))s]"; }

stage "cargo fmt --check"
cargo fmt --all --check
# A plant whose patch no longer applies (the code around it changed) fails at once, not
# an hour in.
for plant in scripts/plants/*.patch; do
  git apply --check "$plant" || { echo "$plant no longer applies; regenerate it"; exit 1; }
done
# Clippy runs with the test profile, as `cargo test` builds, so both share rocksdb's C++
# build (~17 minutes on two cores); Cargo.toml's `[profile.test.build-override]` makes
# the build script's dependencies come out the same in both commands.
stage "cargo clippy"
cargo clippy --profile test --workspace --all-targets --locked -- -D warnings
stage "cargo test"
cargo test --workspace --locked

sim() { RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR="$SIM_TARGET" cargo "$@"; }
stage "simulator: clippy and unit tests (--cfg madsim)"
sim clippy --profile test -p tessera-sim -p tessera-scenarios --all-targets --locked -- -D warnings
sim test -p tessera-sim --locked
sim build --release -p tessera-scenarios --locked
RUNNER="$SIM_TARGET/release/tessera-scenarios"

# Every scenario, every seed must pass: a fixed sweep (seeds 1..SEEDS) that every run
# repeats, and fresh seeds derived from the commit, so each CI run also explores ground
# no run before it did. A failing seed is replayed at once (the runner says whether its
# trace repeats) and prints its replay command; once fixed, it goes into
# scripts/regressions.txt. Two scenarios run at a time (two cores). 16 scenarios x 150
# seeds: 2,400 seed-runs.
SEEDS="${TESSERA_SEEDS:-100}"
FRESH="${TESSERA_FRESH_SEEDS:-50}"
SCENARIOS="${TESSERA_SCENARIOS:-steady chunkserver-crash partition master-restart disk-corruption gc beyond-claim concurrent-writers record-append stale-replica scrub stuck-disk last-copy-rot lost-remove lost-remove-group all-faults steady-large master-failover master-failover-5 master-replace}"
COMMIT="$(git rev-parse HEAD 2>/dev/null || echo 0)"
FRESH_FIRST=$(( 100000 + 0x${COMMIT:0:7} % 1000000 * 100 ))
stage "scenarios: seeds 1-$SEEDS and $FRESH fresh seeds from $FRESH_FIRST (commit ${COMMIT:0:12}): $SCENARIOS"
LOGS="$(mktemp -d)"
sweep() {
  local s="$1"
  if "$RUNNER" run "$s" --seeds "$SEEDS" > "$LOGS/$s.fixed" 2>&1 \
    && { [ "$FRESH" = 0 ] || "$RUNNER" run "$s" --seeds "$FRESH" --first "$FRESH_FIRST" > "$LOGS/$s.fresh" 2>&1; }; then
    tail -q -n 1 "$LOGS/$s".* | grep '^scenario='
  else
    grep -v 'result=ok' "$LOGS/$s".* >&2
    echo "FAILED: scenario $s" >&2
    return 1
  fi
}
export -f sweep
export RUNNER SEEDS FRESH FRESH_FIRST LOGS
printf '%s\n' $SCENARIOS | xargs -P 2 -I{} bash -c 'sweep {}'
RUNS=$(cat "$LOGS"/* | grep -c '^seed=')
stage "$RUNS seed-runs passed"
stage "regression seeds (scripts/regressions.txt)"
grep -v '^#' scripts/regressions.txt | while read -r scenario seed _; do
  if [ -n "$scenario" ]; then
    "$RUNNER" run "$scenario" --seed "$seed"
  fi
done
stage "determinism: each scenario's first 3 seeds run twice, traces compared"
for s in $SCENARIOS; do
  "$RUNNER" run "$s" --seeds 3 --first 1000 --check-determinism
done
# Traces recorded in the simulator replay in another process, masters exactly, through
# restarts, crashes and log damage: a master whose steps depend on anything its trace
# does not hold (a clock read, an unseeded random draw, the process's hash keys) fails
# here. Fresh seeds each commit.
stage "trace replay: simulator runs recorded, each master replayed with tessera replay node"
TRACES="$(mktemp -d)"
for s in master-restart all-faults concurrent-writers master-failover; do
  "$RUNNER" run "$s" --seeds 3 --first "$FRESH_FIRST" --trace-dir "$TRACES" > /dev/null
done
# A master group's replicas record their masters' runs too: some must have led.
led=0
for m in "$TRACES"/master-failover-*/master-*; do
  if ls "$m"/*.trace > /dev/null 2>&1; then led=$((led + 1)); fi
done
if [ "$led" -eq 0 ]; then
  echo "no master group replica recorded a trace: the group's masters were not replayed"
  exit 1
fi
for m in "$TRACES"/*/master-*; do
  # A master group's replica records its master's runs, one each time it led: one that
  # never led has recorded nothing.
  if ! ls "$m"/*.trace > /dev/null 2>&1; then
    echo "($m: never led)"
    continue
  fi
  "$CARGO_TARGET_DIR/debug/tessera" replay node "$m" | grep -v '^note:' | tr '\n' ' '
  echo "($m)"
done
# Workload replay: the client operations of recorded runs (a private workload, and
# record appends) become the workload of other scenarios, under other seeds and faults,
# with every checker; `--check-determinism` runs each twice.
stage "workload replay: recorded runs replayed under other scenarios and seeds"
"$RUNNER" run steady --seed "$FRESH_FIRST" --trace-dir "$TRACES/steady" > /dev/null
"$RUNNER" run record-append --seed "$FRESH_FIRST" --trace-dir "$TRACES/appends" > /dev/null
"$RUNNER" replay "$TRACES/steady" --scenario all-faults --seeds 3 --first 7 --check-determinism
"$RUNNER" replay "$TRACES/steady" --scenario stale-replica --seeds 2 --first 11
"$RUNNER" replay "$TRACES/appends" --scenario chunkserver-crash --seeds 2 --first 13
rm -rf "$TRACES"
stage "planted bugs: each must be caught by the check it exists for"
./scripts/planted-bugs.sh
# A short real fuzzing run of every cargo-fuzz target (their committed corpora already
# ran under cargo test); new inputs go to a scratch directory, a crash fails the run.
stage "fuzz: every target for ${TESSERA_FUZZ_SECS:-30}s"
./scripts/fuzz.sh "${TESSERA_FUZZ_SECS:-30}"
