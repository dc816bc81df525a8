#!/usr/bin/env python3
"""Per-phase SM clock and power from wgmma-power.sh's phase times and nvidia-smi samples.

  python3 scripts/gpu/wgmma-power.py PHASES SMI_CSV

For each phase (a backend on a case, one round), the phase's last stretch of loaded samples
(power above 400 W: the case's warm-up and timed launches; the process's exit after it, and in
peers.py's phase the matrix-product ceiling before it, lie outside) gives the mean SM clock,
power and temperature; the table puts ours and cuDNN side by side with the time ratio and the
ratio of cycles (time x clock).
"""
import datetime as dt
import sys

phases = {}
for line in open(sys.argv[1]):
    w = line.split()
    key = (w[1], w[2], w[3])  # backend, case, round
    if w[4] == "start":
        phases.setdefault(key, {})["start"] = float(w[5])
    else:
        phases[key]["end"] = float(w[5])
        phases[key]["ms"] = float(w[7]) if w[7] != "None" else float("nan")
samples = []
for line in open(sys.argv[2]):
    w = [x.strip() for x in line.split(",")]
    try:
        t = dt.datetime.strptime(w[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((t, float(w[1]), float(w[2]), float(w[3])))
    except (ValueError, IndexError):
        pass
# nvidia-smi's timestamps are local time; `date +%s` is UTC-based epoch: align by the offset
# that puts the first sample just before the first phase (both clocks on one machine).
off = 0.0
if samples:
    first = min(p["start"] for p in phases.values())
    off = round((first - samples[0][0]) / 3600.0) * 3600.0


def stats(p):
    inside = [s for s in samples if p["start"] <= s[0] + off <= p["end"]]
    # the last run of loaded samples, walking back from the phase's end
    sel = []
    for s in reversed(inside):
        if s[2] >= 400.0:
            sel.append(s)
        elif sel:
            break
    if not sel:
        return float("nan"), float("nan"), float("nan"), 0
    n = len(sel)
    return sum(s[1] for s in sel) / n, sum(s[2] for s in sel) / n, max(s[3] for s in sel), n


print(f"{'case':22} {'round':>5} {'ours ms':>8} {'MHz':>6} {'W':>5} {'C':>3} {'cudnn ms':>8} {'MHz':>6} {'W':>5} {'C':>3} {'time ours/cudnn':>15} {'cycles ours/cudnn':>17}")
for (be, case, rnd), p in sorted(phases.items(), key=lambda kv: (kv[0][1], kv[0][2])):
    if be != "ours" or ("cudnn", case, rnd) not in phases:
        continue
    q = phases[("cudnn", case, rnd)]
    c1, w1, t1, n1 = stats(p)
    c2, w2, t2, n2 = stats(q)
    tr = p["ms"] / q["ms"]
    print(f"{case:22} {rnd:>5} {p['ms']:8.4f} {c1:6.0f} {w1:5.0f} {t1:3.0f} {q['ms']:8.4f} {c2:6.0f} {w2:5.0f} {t2:3.0f} {tr:15.3f} {tr * c1 / c2:17.3f}")
