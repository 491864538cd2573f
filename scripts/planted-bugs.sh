#!/usr/bin/env bash
# The planted-bug check: every patch in scripts/plants/ plants one bug in a copy of the
# source. The scenario runner built from that copy must fail the scenario the patch's
# header names, on one of the seeds its `seeds:` line lists or the first MAX, with a
# violation containing the header's `expect:` text (the check the plant exists for; several
# may be given, separated by " || "),
# and the same seed must pass without the plant. A plant the scenarios do not catch within
# 100 seeds, found by the mutation_protocol fuzzer instead, names the input the fuzzer found
# (`fuzz-input:`, kept in the corpus): run in the planted copy, it must fail by `expect:`.
# A `replay: S N` line runs the scenario on the client operations recorded from run S
# seed N (workload replay) instead of its own workload. Prints the catch table; exits non-zero if a plant goes uncaught or is caught
# only by another check. Run by scripts/test.sh; the plants never touch the clone.
#   ./scripts/planted-bugs.sh [max-seeds]     (PLANTS="early-ack no-padding" narrows it)
set -euo pipefail
cd "$(dirname "$0")/.."
MAX="${1:-40}"
CACHE="${TESSERA_CACHE:-$HOME/.cache/tessera}"
SIM_TARGET="$CACHE/target-madsim"
PLANT_TARGET="$CACHE/target-plants"
SRC="$CACHE/plant-src"
OUT="$CACHE/planted"
mkdir -p "$OUT"
# The runner without plants, for the same seeds (a no-op build when test.sh made it).
CLEAN="$SIM_TARGET/release/tessera-scenarios"
RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR="$SIM_TARGET" \
  cargo build --quiet --release -p tessera-scenarios --locked
# Plants are built incrementally: each differs from the last in one function or two, and
# the source copy keeps its path, so a planted build takes ~15 s where a full rebuild of
# the workspace's crates takes ~2 minutes (49 plants would not fit CI's 90 minutes).
export CARGO_INCREMENTAL=1  # (not for the runner above: test.sh built it as it is)
PLANTS="${PLANTS:-$(cd scripts/plants && ls ./*.patch | sed 's|^\./||; s|\.patch$||')}"

header() { sed -n "s/^# $2: //p" "scripts/plants/$1.patch" | head -n 1; }

took() { echo "  ($((SECONDS - began)) s)"; }
failed=0
for p in $PLANTS; do
  began=$SECONDS
  patch="scripts/plants/$p.patch"
  scenario=$(header "$p" scenario)
  expect=$(header "$p" expect)
  unit=$(header "$p" test)
  found=$(header "$p" fuzz-input)
  # A copy of the tracked files as they are now, with the bug planted.
  rm -rf "$SRC"
  mkdir -p "$SRC"
  git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$SRC"
  if ! (cd "$SRC" && git apply "$OLDPWD/$patch"); then
    echo "plant=$p: the patch no longer applies to the code; regenerate it" >&2
    failed=1
    took
    continue
  fi
  if [ -n "$unit" ]; then
    # The unit test written for it must fail (it passes in the normal test run). A plant
    # that names a scenario too must also be caught by it, below.
    if out=$(cd "$SRC" && CARGO_TARGET_DIR="$PLANT_TARGET-test" \
      cargo test --quiet -p tessera-core --lib --locked -- --exact "$unit" 2>&1); then
      echo "plant=$p test=$unit not caught: the test passes with the plant"
      failed=1
    elif ! grep -q -F -e "---- $unit stdout ----" <<<"$out"; then
      # A planted copy that does not build, or a test name that runs nothing, fails too:
      # only the named test failing counts.
      echo "plant=$p test=$unit not caught: the test did not run and fail: $(grep -m1 -E '^error' <<<"$out")"
      failed=1
    else
      echo "plant=$p test=$unit ok: the test fails with the plant"
    fi
    if [ -z "$scenario" ]; then
      took
      continue
    fi
  fi
  if [ -n "$found" ]; then
    # A bug the scenarios miss and the mutation_protocol fuzzer found: the input it found
    # (in the committed corpus, where it passes) must fail in the planted copy, by the
    # expected check.
    out=$(cd "$SRC" && MP_INPUT="$SRC/$found" CARGO_TARGET_DIR="$PLANT_TARGET-test" \
      cargo test --quiet --release -p tessera-sim --locked --test mutation_protocol one_input 2>&1 || true)
    if grep -q -F "$expect" <<<"$out"; then
      echo "plant=$p fuzz-input=$found ok: $(grep -m1 -F "$expect" <<<"$out" | cut -c1-160)"
    else
      echo "plant=$p fuzz-input=$found not caught: $(grep -m1 'panicked' -A1 <<<"$out" | tail -n 1 | cut -c1-160)"
      failed=1
    fi
    took
    continue
  fi
  if [ -z "$scenario" ] || [ -z "$expect" ]; then
    echo "plant=$p: its header names no scenario or expected check, nor a test" >&2
    failed=1
    continue
  fi
  (cd "$SRC" && RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR="$PLANT_TARGET" \
    cargo build --quiet --release -p tessera-scenarios --locked 2>/dev/null) || {
    echo "plant=$p: does not build" >&2
    failed=1
    continue
  }
  cp "$PLANT_TARGET/release/tessera-scenarios" "$OUT/runner-$p"
  # `replay: S N`: the scenario's workload is the client operations of run S seed N,
  # recorded by the runner without the plant (workload replay must catch it too).
  how=(run "$scenario")
  recorded=$(header "$p" replay)
  if [ -n "$recorded" ]; then
    read -r rs rn <<<"$recorded"
    rm -rf "$OUT/recorded-$p"
    if ! "$CLEAN" run "$rs" --seed "$rn" --trace-dir "$OUT/recorded-$p" >/dev/null 2>&1; then
      echo "plant=$p: recording $rs seed $rn without the plant failed" >&2
      failed=1
      continue
    fi
    how=(replay "$OUT/recorded-$p" --scenario "$scenario")
  fi
  result="not caught in $MAX seeds of ${how[*]}"
  for seed in $(header "$p" seeds) $(seq 1 "$MAX"); do
    out=$("$OUT/runner-$p" "${how[@]}" --seed "$seed" 2>/dev/null || true)
    if grep -q 'result=FAIL' <<<"$out"; then
      # `expect:` may name several checks, separated by " || ": any of them will do.
      pats=()
      while IFS= read -r e; do [ -n "$e" ] && pats+=(-e "$e"); done <<<"${expect// || /$'\n'}"
      line=$(grep -m1 -F "${pats[@]}" <<<"$out" || true)
      if [ -z "$line" ]; then
        result="caught at seed $seed by another check: $(grep -m1 'violated:' <<<"$out")"
        break
      fi
      if ! "$CLEAN" "${how[@]}" --seed "$seed" >/dev/null 2>&1; then
        result="seed $seed fails without the plant too"
        break
      fi
      result="ok: caught at seed $seed, which passes unplanted: ${line#*violated: }"
      break
    fi
  done
  echo "plant=$p scenario=$scenario $result" | cut -c1-240
  took
  case "$result" in ok:*) ;; *) failed=1 ;; esac
done
exit "$failed"
