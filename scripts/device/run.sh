#!/usr/bin/env bash
# The device-run recipes: the project's repeatable GPU measurements, by name.
#
#   bash scripts/device/run.sh RECIPE [ARGS...] [+ RECIPE [ARGS...]]...
#
# Runs on the GPU machine in the repository root. The release binary is `.gpu/flashattn`
# (copied there from target/release/flashattn before the device call; $FLASHATTN overrides),
# the Python wheel (recipes python, one-process) `.gpu/flashattn-*.whl`. Every result goes
# under $OUT (the folder whose files come back); $OUT/log.txt collects the timestamped summary
# of every step. `+` chains recipes in one call; `list` prints them. See README.md here.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
B=${FLASHATTN:-./.gpu/flashattn}
: "${OUT:?set OUT to the folder whose files come back}"
mkdir -p "$OUT" || exit 2
L=$OUT/log.txt
# The Python peers (PyTorch SDPA, cuDNN, the package): tools/bench/peers.py in the workspace
# layout, bench/peers.py before it.
PEERS=${PEERS:-$( [ -f tools/bench/peers.py ] && echo tools/bench/peers.py || echo bench/peers.py )}
export PEERS
T0=$(date +%s)

# ---- the shared preamble -------------------------------------------------------------------

# el MESSAGE: a timestamped line on stdout and in the log.
el() { echo "[t=$(( $(date +%s) - T0 ))s] $*" | tee -a "$L"; }
# say: stdin to stdout and the log.
say() { tee -a "$L"; }
# gpu_state: name, clocks, temperature and power, for the log.
gpu_state() {
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader 2>&1 | say
}
# smi_start FILE / smi_stop: SM clock, power and temperature sampled every 100 ms into FILE;
# smi_stop summarises them in the log (a bench line's speed depends on the clock it ran at).
smi_start() {
  SMI_FILE=$1
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 100 > "$SMI_FILE" 2>/dev/null &
  SMI_PID=$!
}
smi_stop() {
  kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null
  awk -F', ' '{n++; c+=$1; p+=$2; if($1<mn||n==1)mn=$1; if($1>mx)mx=$1; if($2>pm)pm=$2; if($3>tm)tm=$3}
    END {if (n) printf "smi samples %d: sm clock mean %.0f min %d max %d MHz; power mean %.0f max %.0f W; max temp %d C\n", n, c/n, mn, mx, p/n, pm, tm}' "$SMI_FILE" | say
}
# verdict FILE RC: a check's exit status, last line, pass count and first non-passing lines.
verdict() {
  echo "exit $2" | say
  tail -1 "$1" | say
  echo "passes: $(grep -c '^\[PASS\]' "$1")" | say
  grep -v '^\[PASS\]' "$1" | grep -v '^checking' | head -8 | cut -c1-300 | say
}
# py_setup: the wheel unpacked onto PYTHONPATH (no pip install on the device machine).
py_setup() {
  local whl
  whl=$(ls .gpu/flashattn-*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] || { el "no .gpu/flashattn-*.whl: build it with maturin and copy it there"; return 1; }
  rm -rf /tmp/pyfa && python3 -m zipfile -e "$whl" /tmp/pyfa
  export PYTHONPATH=/tmp/pyfa
}
# on_or_off VALUE: the bench's causal spelling (on|off) from on/off/1/0/causal.
on_or_off() { case $1 in on|1|causal|yes) echo on ;; *) echo off ;; esac; }
# opt_value NAME ARGS...: the value ARGS give option NAME (NAME VALUE or NAME=VALUE), or nothing.
opt_value() {
  local n=$1; shift
  while [ $# -gt 0 ]; do
    case $1 in "$n") echo "${2:-}"; return ;; "$n"=*) echo "${1#*=}"; return ;; esac
    shift
  done
}
# with_defaults OPTION VALUE [OPTION VALUE...] -- ARGS...: sets the array D to the recipe's
# OPTION VALUE pairs that ARGS do not give themselves, then ARGS (a recipe's defaults stay
# overridable: the bench refuses an option given twice).
with_defaults() {
  local pairs=() i
  while [ "$1" != -- ]; do pairs+=("$1" "$2"); shift 2; done
  shift
  D=()
  for ((i = 0; i < ${#pairs[@]}; i += 2)); do
    [ -n "$(opt_value "${pairs[i]}" "$@")" ] || D+=("${pairs[i]}" "${pairs[i+1]}")
  done
  D+=("$@")
}

# ---- the recipes ---------------------------------------------------------------------------

# check [quick|full] [KERNELS] [FILTER] [SECONDS]: the kernels against the f64 oracle
# (default: quick, all, no filter, 600 s) into $OUT/check-*.txt. KERNELS as `check --kernel`
# takes them (all, wgmma, mma, "wgmma,mma", ...); FILTER a substring of the case names
# (e.g. "d=128", "kvcache", "backward", "varlen").
r_check() {
  local sweep=${1:-quick} kernels=${2:-all} filter=${3:-} secs=${4:-600} args=()
  [ "$sweep" = quick ] && args+=(--quick)
  [ -n "$filter" ] && args+=(--filter "$filter")
  local file=$OUT/check-$sweep-${kernels//,/-}${filter:+-${filter//[^A-Za-z0-9=]/_}}.txt
  el "check $sweep --kernel $kernels${filter:+ --filter '$filter'}"
  timeout "$secs" "$B" check --kernel "$kernels" "${args[@]}" > "$file" 2>&1
  verdict "$file" $?
}

# probe: info, the fragment-layout probe on the GPU, and the injected fault (exit 1 expected:
# the probe must name the wrong lanes).
r_probe() {
  el info; "$B" info 2>&1 | say; gpu_state
  el probe; "$B" probe > "$OUT/probe.txt" 2>&1; echo "probe exit $?" | say; tail -3 "$OUT/probe.txt" | say
  "$B" probe --inject-fault > "$OUT/probe-fault.txt" 2>&1; echo "probe --inject-fault exit $? (1 expected)" | say
  el "run (the MiniLM sample, both masks)"
  for m in "" --causal; do "$B" run $m 2>&1 | tail -2 | say; done
}

# sanitize [KERNELS] [FILTER] [SECONDS] [TOOLS]: compute-sanitizer on the quick check
# (default: all kernels, no filter, 300 s per tool, TOOLS "memcheck racecheck synccheck
# initcheck"). Racecheck on the whole wgmma sweep takes minutes: narrow it with a FILTER.
r_sanitize() {
  local kernels=${1:-all} filter=${2:-} secs=${3:-300} tools=${4:-memcheck racecheck synccheck initcheck} args=(--quick) tool
  [ -n "$filter" ] && args+=(--filter "$filter")
  for tool in $tools; do
    el "$tool: check --quick --kernel $kernels${filter:+ --filter '$filter'}"
    timeout "$secs" compute-sanitizer --tool "$tool" "$B" check --kernel "$kernels" "${args[@]}" > /tmp/san.txt 2>&1
    echo "$tool exit $?" | say
    cat /tmp/san.txt >> "$OUT/sanitize-$tool.txt"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed,|Hazard" /tmp/san.txt | sort | uniq -c | head -4 | cut -c1-200 | say
    echo "passes: $(grep -c '^\[PASS\]' /tmp/san.txt)" | say
  done
}

# bench [BENCH-ARGS...]: the forward sweep against the SDPA peers (flash, cuDNN, efficient) and
# the dense matrix-product ceiling, d64/d128/d256, f16/bf16, causal off/on, 512..16k: ours and
# the peers (one persistent peers.py process) interleaved case by case in both orders, each line
# after 300 ms of warm-up (the lines run back to back, so the GPU stays in its sustained state
# between them) and timed over at least 250 ms (and 20 launches); about 450 s; SM clock and
# power sampled. Extra arguments go to `bench` and replace the recipe's own --head-dim,
# --warmup-ms, --iters, --window-ms, --out-dir (e.g. `--head-dim 128 --seqlen 4k`).
# Plots: `flashattn bench-plot --json $OUT/bench/bench.json`.
r_bench() {
  with_defaults --head-dim 64,128,256 --warmup-ms 300 --iters 20 --out-dir "$OUT/bench" -- "$@"
  local dir; dir=$(opt_value --out-dir "${D[@]}")
  el "bench --peers ${D[*]}"
  smi_start "$dir-smi.csv"
  timeout 570 "$B" bench --peers --no-plot "${D[@]}" > "$dir-log.txt" 2>&1
  echo "bench exit $?" | say
  smi_stop
  grep -v "^\[peers" "$dir-log.txt" | grep -v "^\[ours" | tail -3 | say
  cat "$dir/bench.txt" 2>/dev/null | say
}

# bench-decode [BENCH-ARGS...]: the KV-cache decode sweep (batch x cache length, contiguous
# and paged) against the SDPA peers, interleaved shape by shape in both orders, each line after
# 200 ms of warm-up and over at least 250 ms; about 400 s. Extra arguments as for `bench`.
r_bench_decode() {
  with_defaults --warmup-ms 200 --iters 20 --out-dir "$OUT/bench-decode" -- "$@"
  local dir; dir=$(opt_value --out-dir "${D[@]}")
  el "bench --decode --peers ${D[*]}"
  smi_start "$dir-smi.csv"
  timeout 570 "$B" bench --decode --peers "${D[@]}" > "$dir-log.txt" 2>&1
  echo "bench exit $?" | say
  smi_stop
  cat "$dir/bench-decode.txt" 2>/dev/null | say
}

# bench-backward [BENCH-ARGS...]: the backward (dq, dk, dv) against the SDPA peers, f16 and
# bf16, d64/d128, 1k/4k/16k; lines bwd (the default kernel), bwd-mma, bwd-det; interleaved
# case by case in both orders, each line after 500 ms of warm-up and over at least 250 ms;
# about 300 s. Extra arguments as for `bench`.
r_bench_backward() {
  with_defaults --dtype both --head-dim 64,128 --seqlen 1024,4096,16384 --out-dir "$OUT/bench-backward" -- "$@"
  local dir; dir=$(opt_value --out-dir "${D[@]}")
  el "bench --backward --peers ${D[*]}"
  smi_start "$dir-smi.csv"
  timeout 570 "$B" bench --backward --peers --no-plot "${D[@]}" > "$dir-log.txt" 2>&1
  echo "bench exit $?" | say
  smi_stop
  cat "$dir/bench.txt" 2>/dev/null | say
}

# bench-varlen [MIXES] [BENCH-ARGS...]: packed variable-length batches (default mixes
# "8x2k ragged"), f16, d64/d128.
r_bench_varlen() {
  local mixes=${1:-8x2k ragged} mix
  shift || true
  for mix in $mixes; do
    el "bench --varlen $mix $*"
    timeout 200 "$B" bench --varlen "$mix" --dtype f16 --head-dim 64,128 --no-plot --out-dir "$OUT/bench-varlen-$mix" "$@" > "$OUT/bench-varlen-$mix-log.txt" 2>&1
    echo "bench exit $?" | say
    cat "$OUT/bench-varlen-$mix/bench-varlen.txt" 2>/dev/null | say
  done
}

# ncu [DTYPE] [HEAD_DIM] [CAUSAL] [SEQLEN] [KERNEL] [cudnn]: Nsight Compute on one launch of one
# bench case (default f16 128 off 1024, attn_wgmma; attn_mma, attn_bwd_wgmma, attn_bwd too): speed of light, compute and memory
# workload, warp states with every stall reason, scheduler, and the tensor-pipe, issue and
# MUFU metrics; with `cudnn` last, cuDNN's SDPA kernel on the same shape (sdpa-once.py).
r_ncu() {
  local dt=${1:-f16} d=${2:-128} causal sk=${4:-1024} kernel=${5:-attn_wgmma} peer=${6:-}
  causal=$(on_or_off "${3:-off}")
  local m=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__cycles_active.avg,gpu__time_duration.sum,regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$
  local secs=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats)
  local kernels=(--kernels wgmma)
  case $kernel in
    attn_mma) kernels=(--kernels mma) ;;
    attn_bwd_wgmma) kernels=(--backward --kernels bwd) ;;
    attn_bwd) kernels=(--backward --kernels bwd-mma) ;;
  esac
  local name=ncu-$kernel-$dt-d$d-$causal-$sk
  el "ncu $kernel $dt d$d causal $causal $sk"
  timeout 200 ncu --clock-control none --kernel-name "$kernel" --launch-skip 3 --launch-count 1 "${secs[@]}" --metrics "$m" \
    "$B" bench "${kernels[@]}" --dtype "$dt" --head-dim "$d" --seqlen "$sk" --causal "$causal" --warmup-ms 0 --warmup 1 --iters 20 --no-plot --out-dir /tmp/bn \
    > "$OUT/$name.txt" 2>&1
  echo "ncu exit $?" | say
  grep -E "Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|hmma_cycles_active|issue_active" "$OUT/$name.txt" | head -8 | say
  if [ "$peer" = cudnn ]; then
    el "ncu cudnn $dt d$d causal $causal $sk"
    local cz=0; [ "$causal" = on ] && cz=1
    # The backward kernels: cuDNN's flash backward is named *bprop*.
    local pk=regex:sdpa pass=fwd
    case $kernel in attn_bwd*) pk=regex:bprop; pass=bwd ;; esac
    timeout 200 ncu --clock-control none --kernel-name "$pk" --launch-skip 1 --launch-count 1 "${secs[@]}" --metrics "$m" \
      python3 "$HERE/sdpa-once.py" cudnn "$d" "$sk" "$cz" 3 "$dt" "$pass" > "$OUT/ncu-cudnn-$pass-$dt-d$d-$causal-$sk.txt" 2>&1
    echo "ncu exit $?" | say
    grep -E "Duration|hmma_cycles_active|issue_active" "$OUT/ncu-cudnn-$pass-$dt-d$d-$causal-$sk.txt" | head -4 | say
  fi
}

# one-process [BENCH_JSON] [WARMUP_MS]: the Python package and cuDNN in ONE process,
# alternating case by case in both orders over long timing windows (one-process.py), on the
# d64/d128 1k-16k cases of BENCH_JSON (default: the committed H200 forward sweep); SM clock
# and power sampled. Both sides under the same clock, as the package sees it (the `bench*`
# recipes interleave the Rust binary and the peers the same way).
r_one_process() {
  local json=${1:-docs/results/h200/bench.json} warm=${2:-800}
  py_setup || return 1
  el "one-process: the package and cuDNN alternating ($json, warm-up $warm ms)"
  smi_start "$OUT/one-process-smi.csv"
  timeout 500 python3 "$HERE/one-process.py" "$json" "$OUT" "$warm" 2> "$OUT/one-process-log.txt" | say
  smi_stop
}

# python: the package's CUDA tests, the two examples, the host time per call (py-host.py) and
# the cross-check of the package against the Rust bench on the 12 f16 cases
# (py-crosscheck.py; XC_PEERS=flashattn,cudnn adds cuDNN).
r_python() {
  py_setup || return 1
  el pytest
  timeout 300 python3 -m pytest -q -p no:cacheprovider python/tests -ra 2>&1 | tail -8 | say
  el examples
  timeout 90 python3 python/examples/torch_module.py 2>&1 | tail -2 | say
  timeout 90 python3 python/examples/transformers_attention.py 2>&1 | grep -v -i warn | tail -2 | say
  el "host time per call"
  timeout 90 python3 "$HERE/py-host.py" 2>&1 | say
  el "cross-check against the Rust bench"
  timeout 100 "$B" bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/xr > /dev/null 2>&1
  XC_PEERS=${XC_PEERS:-flashattn} timeout 200 python3 "$HERE/py-crosscheck.py" /tmp/xr/bench.json "$OUT/crosscheck.json" 2>&1 | say
}

# ab ROUNDS "label=BIN label=BIN ..." [BENCH-ARGS...]: interleaved A/B timing of builds (the
# way every kernel change was judged): each label's `BIN bench --kernels wgmma` in turn,
# ROUNDS times, then the means and ratios to the first label (ab-table.py). A label's BIN may
# be a wrapper script that sets an environment variable (e.g. FLASHATTN_WGMMA_TILE).
# AB_KERNELS picks the line (default wgmma; `bwd` with `--backward` in BENCH-ARGS).
r_ab() {
  local rounds=${1:?ROUNDS} pairs=${2:?label=BIN ...} round pair
  shift 2
  for round in $(seq 1 "$rounds"); do
    for pair in $pairs; do
      local v=${pair%%=*} bin=${pair#*=}
      el "bench $v round $round"
      timeout 200 "$bin" bench --kernels "${AB_KERNELS:-wgmma}" --no-plot --out-dir "/tmp/ab-$v-$round" "$@" > /tmp/ab.log 2>&1
      echo "bench exit $?" | say
      grep -E "^(f16|bf16)" "/tmp/ab-$v-$round/bench.txt" | awk -v v="$v" -v r="$round" '{print v, r, $0}' >> "$OUT/ab.txt"
    done
  done
  python3 "$HERE/ab-table.py" "$OUT/ab.txt" | say
}

# timeline [HEAD_DIM] [SEQLEN] [CAUSAL]: attn_wgmma's per-phase timeline in SM cycles (the
# `trace` build of the kernel, summarised by wgmma-trace.py), f16, default d128 1024 off.
r_timeline() {
  local d=${1:-128} sk=${2:-1024} causal
  causal=$(on_or_off "${3:-off}")
  el "timeline d$d $sk causal $causal"
  FLASHATTN_WGMMA_TILE=trace FLASHATTN_WGMMA_TRACE=/tmp/tr.json timeout 120 "$B" bench --kernels wgmma --dtype f16 --head-dim "$d" --seqlen "$sk" --causal "$causal" \
    --warmup 2 --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1
  echo "bench exit $?" | say
  { echo "== d$d $sk causal $causal"; python3 "$HERE/wgmma-trace.py" /tmp/tr.json 2>&1; } | tee -a "$OUT/timeline.txt"
}

# list: the recipes, one line each (README.md here has their arguments and outputs).
r_list() {
  cat <<'EOF'
check [quick|full] [KERNELS] [FILTER] [SECONDS]   kernels against the f64 oracle
probe                                             info, layout probe (+ injected fault), MiniLM run
sanitize [KERNELS] [FILTER] [SECONDS] [TOOLS]     compute-sanitizer (4 tools) on the quick check
bench [BENCH-ARGS...]                             forward against the SDPA peers (interleaved), clocks sampled
bench-decode [BENCH-ARGS...]                      KV-cache decode against the SDPA peers (interleaved)
bench-backward [BENCH-ARGS...]                    backward against the SDPA peers (interleaved)
bench-varlen [MIXES] [BENCH-ARGS...]              packed variable-length batches
ncu [DTYPE] [D] [CAUSAL] [SEQLEN] [KERNEL] [cudnn] Nsight Compute on one case (and cuDNN's)
one-process [BENCH_JSON] [WARMUP_MS]              the package and cuDNN alternating in one process
python                                            the package's CUDA tests, examples, host time
ab ROUNDS "a=BIN b=BIN" [BENCH-ARGS...]           interleaved A/B timing of builds
timeline [D] [SEQLEN] [CAUSAL]                    attn_wgmma's per-phase timeline (cycles)
EOF
}

# ---- dispatch: RECIPE ARGS... [+ RECIPE ARGS...] ------------------------------------------

run_one() {
  local name=$1 fn
  shift
  fn=r_${name//-/_}
  if ! declare -F "$fn" > /dev/null; then
    echo "unknown recipe '$name'; recipes:" >&2
    r_list >&2
    return 2
  fi
  [ "$name" = list ] || { el "== recipe $name $*"; [ -x "$B" ] || el "warning: $B is not an executable (copy target/release/flashattn there)"; }
  "$fn" "$@"
}

[ $# -ge 1 ] || { r_list; exit 2; }
status=0
args=()
for a in "$@" +; do
  if [ "$a" = + ]; then
    [ ${#args[@]} -gt 0 ] && { run_one "${args[@]}" || status=$?; }
    args=()
  else
    args+=("$a")
  fi
done
[ "$1" = list ] || el "done (status $status)"
exit $status
