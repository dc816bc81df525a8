#!/usr/bin/env python3
"""Summarise an attn_wgmma timeline (src/cuda/wgmma_trace.rs writes it; slot layout there).

  python3 scripts/device/wgmma-trace.py TRACE.json [--skip-rounds 1]

Per consumer, averaged over blocks and over the traced rounds after the first (the first
starts with the launch): the tile's period (hand-over to the next hand-over) split into its
phases, then the phases of each key tile n, in SM cycles. Clock values wrap at 2^32: every
difference is taken modulo 2^32.
"""

import argparse
import json
import statistics


def d(a, b):
    return (b - a) % (1 << 32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--skip-rounds", type=int, default=1)
    a = ap.parse_args()
    t = json.load(open(a.trace))
    blocks, rounds, roles, slots = t["blocks"], t["rounds"], t["roles"], t["slots"]
    data = t["data"]
    it0, iters = 16, (slots - 16) // 6

    def row(b, r, role):
        base = ((b * rounds + r) * roles + role) * slots
        return data[base : base + slots]

    print(f"config {t['config']}, {blocks} blocks, {rounds} rounds traced, {roles - 1} consumers")
    for c in range(1, roles):
        phases = {}
        per_iter = {}

        def add(dct, key, v):
            dct.setdefault(key, []).append(v)

        for b in range(blocks):
            for r in range(a.skip_rounds, rounds - 1):
                x, nxt = row(b, r, c), row(b, r + 1, c)
                nblk = x[1]
                if x[4] == 0 or nxt[4] == 0 or x[8] == 0 or nblk == 0:
                    continue
                ev = lambda n, e: x[it0 + 6 * n + e]
                add(phases, "period", d(x[4], nxt[4]))
                add(phases, "a hand-over -> Q arrived", d(x[4], x[5]))
                add(phases, "b Q -> K0 arrived", d(x[5], ev(0, 0)))
                prev_end = ev(0, 4)
                for n in range(min(nblk, iters)):  # key tiles past the traced ones: only in phase c
                    if n == 0:
                        add(per_iter, (0, "turn"), d(ev(0, 0), ev(0, 1)))
                        add(per_iter, (0, "issue"), d(ev(0, 1), ev(0, 2)))
                        add(per_iter, (0, "S wait"), d(ev(0, 2), ev(0, 3)))
                        add(per_iter, (0, "softmax"), d(ev(0, 3), ev(0, 4)))
                        add(per_iter, (0, "total"), d(ev(0, 0), ev(0, 4)))
                        continue
                    add(per_iter, (n, "K wait"), d(prev_end, ev(n, 0)))
                    add(per_iter, (n, "turn"), d(ev(n, 0), ev(n, 1)))
                    add(per_iter, (n, "issue"), d(ev(n, 1), ev(n, 2)))
                    add(per_iter, (n, "S wait"), d(ev(n, 2), ev(n, 3)))
                    add(per_iter, (n, "softmax"), d(ev(n, 3), ev(n, 4)))
                    add(per_iter, (n, "PV wait"), d(ev(n, 4), ev(n, 5)))
                    add(per_iter, (n, "total"), d(prev_end, ev(n, 5)))
                    prev_end = ev(n, 5)
                add(phases, "c key tiles (K0 arrived -> loop done)", d(ev(0, 0), x[6]))
                add(phases, "d last P V", d(x[6], x[7]))
                add(phases, "e epilogue", d(x[7], x[8]))
                add(phases, "f store issued -> next hand-over", d(x[8], nxt[4]))
        if not phases:
            print(f"consumer {c - 1}: no complete rounds")
            continue
        m = {k: statistics.mean(v) for k, v in phases.items()}
        print(f"consumer {c - 1}: {len(phases['period'])} tiles, period {m['period']:.0f} cycles (median {statistics.median(phases['period']):.0f})")
        for k in sorted(m):
            if k != "period":
                print(f"  {k:42s} {m[k]:8.0f}  {100 * m[k] / m['period']:5.1f} %")
        names = ["K wait", "turn", "issue", "S wait", "softmax", "PV wait", "total"]
        print("  key tile  " + "".join(f"{n:>9s}" for n in names))
        for n in sorted({k[0] for k in per_iter}):
            cells = [per_iter.get((n, nm)) for nm in names]
            print(f"  {n:8d}  " + "".join(f"{statistics.mean(v):9.0f}" if v else f"{'-':>9s}" for v in cells))
    # The producer: when it passed the Q-free wait and finished issuing, against consumer 0.
    waits = []
    for b in range(blocks):
        for r in range(a.skip_rounds, rounds):
            p, c0 = row(b, r, 0), row(b, r, 1)
            if p[4] and c0[4]:
                waits.append((d(c0[4], p[4]) if d(c0[4], p[4]) < (1 << 31) else -d(p[4], c0[4])))
    if waits:
        print(f"producer: Q-free wait passed {statistics.mean(waits):.0f} cycles after consumer 0's hand-over of the same round (mean)")


if __name__ == "__main__":
    main()
