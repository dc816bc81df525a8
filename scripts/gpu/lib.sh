# Sourced by the device scripts (scripts/gpu/*.sh): the binary ($B), the log ($L), a
# timestamped echo (el), the wheel unpacked onto PYTHONPATH (py_setup), the Python tests
# (py_tests), the two examples (py_examples) and the host time per call (py_host).
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
