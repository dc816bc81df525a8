#!/usr/bin/env python3
"""The table of an interleaved A/B timing (run.sh's `ab` recipe writes its lines).

  python3 scripts/device/ab-table.py AB.txt

Each line is `label round <bench.txt line>`. For every case (dtype, head_dim, causal, seqlen):
the mean TFLOP/s of each label over its rounds, each label's ratio to the first label, and the
rounds themselves.
"""
import collections
import sys

rows = collections.defaultdict(list)
labels = []
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 7:
        continue
    if f[0] not in labels:
        labels.append(f[0])
    rows[(" ".join(f[2:6]), f[0])].append(float(f[6]))
keys = sorted({k for k, _ in rows}, key=lambda k: (k.split()[0], int(k.split()[1]), k.split()[2], int(k.split()[3])))
base = labels[0]
mean = lambda k, v: sum(rows[(k, v)]) / len(rows[(k, v)]) if rows.get((k, v)) else float("nan")
print("case (dtype, d, causal, seqlen)  " + "".join(f"{v:>9s}" for v in labels) + "".join(f"  {v}/{base}" for v in labels[1:]) + "   rounds")
for k in keys:
    means = [mean(k, v) for v in labels]
    ratios = "".join(f"  {m / means[0]:.3f}" + " " * (len(v) + len(base) - 4) for v, m in zip(labels[1:], means[1:]))
    rounds = " | ".join(" ".join(f"{x:.0f}" for x in rows[(k, v)]) for v in labels)
    print(f"{k:32s} " + "".join(f"{m:9.1f}" for m in means) + ratios + "   " + rounds)
