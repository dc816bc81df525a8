# Sourced by the device scripts (scripts/gpu/*.sh): the binary ($B), the log ($L), a
# timestamped echo (el), the wheel unpacked onto PYTHONPATH (py_setup), the Python tests
# (py_tests), the two examples (py_examples), the host time per call (py_host), interleaved
# A/B timings of wgmma builds (ab_rounds), a binary under a tile override (tile_bin), the wgmma
# check (check_wgmma) and its quick parts under tile overrides (quick_checks), a timeline
# (timeline), compute-sanitizer on part of the quick sweep (sanitize) and ncu's speed-of-light
# profile (ncu_sol), and the default sweep followed by sanitizers (sweep_sanitized).
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a "$L"; }
py_setup() {
  rm -rf /tmp/pyfa && python3 -m zipfile -e .gpu/flashattn-*.whl /tmp/pyfa
  export PYTHONPATH=/tmp/pyfa
}
py_tests() {
  el pytest
  timeout 240 python3 -m pytest -q -p no:cacheprovider python/tests -ra 2>&1 | tail -6 | tee -a "$L"
}
py_examples() {
  el examples
  timeout 90 python3 python/examples/torch_module.py 2>&1 | tail -2 | tee -a "$L"
  timeout 90 python3 python/examples/transformers_attention.py 2>&1 | grep -v -i warn | tail -2 | tee -a "$L"
}
py_host() {
  el "host time"
  timeout 90 python3 scripts/gpu/py-host.py 2>&1 | tee -a "$L"
}
# Interleaved A/B timing of attn_wgmma builds: ab_rounds ROUNDS "a=BIN d=BIN ..." BENCH-ARGS...
# runs `BIN bench --kernels wgmma --no-plot BENCH-ARGS` for each label in turn, ROUNDS times,
# appends "label round <bench line>" to $OUT/ab.txt, then prints ab-table.py's table (means,
# ratios to the first label).
ab_rounds() {
  local rounds=$1 pairs=$2
  shift 2
  for round in $(seq 1 "$rounds"); do
    for pair in $pairs; do
      local v=${pair%%=*} bin=${pair#*=}
      el "bench $v round $round"
      timeout 150 "$bin" bench --kernels wgmma --no-plot --out-dir "/tmp/b-$v-$round" "$@" > /tmp/b.log 2>&1; echo "bench exit $?" | tee -a "$L"
      grep -E "^(f16|bf16)" "/tmp/b-$v-$round/bench.txt" | awk -v v="$v" -v r="$round" '{print v, r, $0}' >> "$OUT/ab.txt"
    done
  done
  python3 scripts/gpu/ab-table.py "$OUT/ab.txt" | tee -a "$L"
}
# tile_bin NAME SPEC: /tmp/NAME, a script that runs $B under FLASHATTN_WGMMA_TILE=SPEC (an A/B
# label for ab_rounds).
tile_bin() {
  printf '#!/bin/sh\nFLASHATTN_WGMMA_TILE=%s exec %s "$@"\n' "$2" "$B" > "/tmp/$1" && chmod +x "/tmp/$1"
}
# check_wgmma SECONDS FILE BIN SPEC [CHECK-ARGS...]: `BIN check --kernel wgmma CHECK-ARGS` under
# FLASHATTN_WGMMA_TILE=SPEC (none when SPEC is empty) into FILE; logs its exit status, last line,
# passes and first non-passing lines; returns the exit status.
check_wgmma() {
  local secs=$1 file=$2 bin=$3 spec=$4
  shift 4
  el "check --kernel wgmma $* ($bin${spec:+ under $spec})"
  if [ -n "$spec" ]; then
    FLASHATTN_WGMMA_TILE="$spec" timeout "$secs" "$bin" check --kernel wgmma "$@" > "$file" 2>&1
  else
    timeout "$secs" "$bin" check --kernel wgmma "$@" > "$file" 2>&1
  fi
  local rc=$?
  echo "check exit $rc" | tee -a "$L"
  tail -1 "$file" | tee -a "$L"
  grep -c "^\[PASS\]" "$file" | tee -a "$L"
  grep -v "^\[PASS\]" "$file" | head -8 | cut -c1-300 | tee -a "$L"
  return $rc
}
# quick_checks SECONDS "FILTER|SPEC" ...: check_wgmma of $B on the FILTER part of the quick
# sweep under each tile SPEC (grids of 2-3 blocks run many tiles per block), appended to
# $OUT/check-wgmma-grid.txt.
quick_checks() {
  local secs=$1 v filt spec
  shift
  for v in "$@"; do
    IFS='|' read -r filt spec <<< "$v"
    check_wgmma "$secs" /tmp/c.txt "$B" "$spec" --quick --filter "$filt"
    cat /tmp/c.txt >> "$OUT/check-wgmma-grid.txt"
  done
}
# timeline BIN SPEC HEAD_DIM SEQLEN CAUSAL FILE: the timeline build (SPEC holds `trace`) of BIN's
# attn_wgmma on one f16 case, summarised by wgmma-trace.py and appended to FILE.
timeline() {
  local bin=$1 spec=$2 d=$3 sk=$4 causal=$5 file=$6
  el "timeline d$d $sk causal $causal ($bin under $spec)"
  FLASHATTN_WGMMA_TILE="$spec" FLASHATTN_WGMMA_TRACE=/tmp/tr.json timeout 90 "$bin" bench --kernels wgmma --dtype f16 --head-dim "$d" --seqlen "$sk" --causal "$causal" --warmup 2 --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "bench exit $?" | tee -a "$L"
  echo "== d$d $sk causal $causal ($spec)" >> "$file"
  python3 scripts/gpu/wgmma-trace.py /tmp/tr.json >> "$file" 2>&1
}
# sanitize TOOL FILTER SECONDS: compute-sanitizer TOOL on the FILTER part of
# `check --quick --kernel wgmma` ($B); logs its exit status, summary and passes.
sanitize() {
  local tool=$1 filt=$2 secs=$3
  el "$tool $filt (quick sweep)"
  timeout "$secs" compute-sanitizer --tool "$tool" "$B" check --quick --kernel wgmma --filter "$filt" > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a "$L"
  grep -E "SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a "$L"
  grep -c "^\[PASS\]" /tmp/san.txt | tee -a "$L"
}
# ncu_sol HEAD_DIM METRICS: ncu's speed of light, compute, memory, warp state and scheduler
# sections with METRICS, on one launch of $B's attn_wgmma (f16, 1k, non-causal), appended to
# $OUT/ncu.txt.
ncu_sol() {
  local d=$1 metrics=$2
  el "ncu d$d 1k"
  echo "==== wgmma f16 d$d 1k non-causal" >> "$OUT/ncu.txt"
  timeout 100 ncu --clock-control none --kernel-name attn_wgmma --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --metrics "$metrics" \
    "$B" bench --kernels wgmma --dtype f16 --head-dim "$d" --seqlen 1024 --causal off --warmup-ms 0 --warmup 1 --iters 20 --no-plot --out-dir /tmp/bn >> "$OUT/ncu.txt" 2>&1; echo "ncu exit $?" | tee -a "$L"
}
# sweep_sanitized "TOOL FILTER SECONDS" ...: the default bench sweep with the peers and d256
# (wgmma-final-b.sh: the README table), then `sanitize TOOL FILTER SECONDS` for each argument.
sweep_sanitized() {
  local v
  el "bench sweep"
  bash scripts/gpu/wgmma-final-b.sh | tail -3 | tee -a "$L"
  for v in "$@"; do
    # shellcheck disable=SC2086 # three words: tool, filter, seconds
    sanitize $v
  done
}
