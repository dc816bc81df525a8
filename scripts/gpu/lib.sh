# Sourced by the device scripts (scripts/gpu/*.sh): the binary ($B), the log ($L), a
# timestamped echo (el), the wheel unpacked onto PYTHONPATH (py_setup), the Python tests
# (py_tests), the two examples (py_examples), the host time per call (py_host) and interleaved
# A/B timings of wgmma builds (ab_rounds).
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
