# Sourced by the device scripts (scripts/gpu/*.sh): the binary ($B), the log ($L), a
# timestamped echo (el), and the wheel unpacked onto PYTHONPATH (py_setup).
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a "$L"; }
py_setup() {
  rm -rf /tmp/pyfa && python3 -m zipfile -e .gpu/flashattn-*.whl /tmp/pyfa
  export PYTHONPATH=/tmp/pyfa
}
