# Interval form of the check (reference range from src/scores.rs semantics), all lengths 1..400.
import sys, itertools
from key_tiles import key_tiles_of, block_row0, block_tiles, kernel_mask, visible, key_hi, key_lo, B30
def ref_range(P, i):
    d = P['sk'] - P['sq']; a = 0; b = P['sk']
    if P['causal']: b = min(b, i + d + 1)
    if P['local']:
        a = max(a, i + d - P['wl'])
        if not P['causal']: b = min(b, i + d + P['wr'] + 1)
    return a, b
def kern_range(P, row0, i):
    lim_block = key_hi(P, row0); lo_block = key_lo(P, row0); off = i - row0
    hi = min(lim_block + off, P['sk']) if (P['causal'] or P['local']) else P['sk']
    lo = lo_block + off if P['local'] else -B30
    return lo, hi
def inter(a, b, x, y):
    a, b = max(a, x), min(b, y)
    return (a, b) if a < b else None
errs = 0; checked = 0; stats = dict(lead_pos=0, nmine0_hasrows=0, norows=0, rest_pos=0, nblocks0=0)
def check(P, ncons, bc):
    global errs, checked
    BR = 64 * ncons; sq, sk = P['sq'], P['sk']
    for mb in range((sq + BR - 1) // BR):
        row0 = block_row0(P, mb, BR)
        nb, ke, ib, ie = block_tiles(P, row0, BR, bc); n_blocks = ke - nb
        if n_blocks == 0: stats['nblocks0'] += 1
        for c in range(ncons):
            crow0 = row0 + 64 * c; has_rows = 0 <= crow0 < sq; lead = n_mine = 0
            if has_rows:
                cb, ce, _, _ = key_tiles_of(P, crow0, min(64, sq - crow0), bc)
                lead = min(cb - nb, n_blocks); n_mine = max(min(ce, ke) - nb - lead, 0)
            rest = n_blocks - lead - n_mine; nc = nb + lead; checked += 1
            stats['lead_pos'] += lead > 0; stats['rest_pos'] += rest > 0
            stats['nmine0_hasrows'] += has_rows and n_mine == 0 and n_blocks > 0; stats['norows'] += not has_rows
            def bad(msg):
                global errs; errs += 1
                if errs < 20: print('ERR', msg, P, ncons, bc, mb, c, (nb, ke, ib, ie), lead, n_mine, flush=True)
            if lead < 0 or n_mine < 0 or rest < 0: bad('counts'); continue
            for i in range(max(crow0, 0), min(crow0 + 64, sq)):
                a, b = ref_range(P, i)
                if a < b and not (nc * bc <= a and b <= (nc + n_mine) * bc): bad('coverage i=%d' % i); break
                lo, hi = kern_range(P, row0, i)
                for t in range(nc, nc + n_mine):
                    x, y = t * bc, (t + 1) * bc
                    r = inter(a, b, x, y)
                    if t < ib or t >= ie:
                        if inter(lo, hi, x, y) != r: bad('mask i=%d t=%d' % (i, t)); break
                    elif r != (x, y): bad('inner not fully visible i=%d t=%d' % (i, t)); break
            if c == 0:
                for i in range(max(row0, 0), min(row0 + BR, sq)):
                    a, b = ref_range(P, i)
                    if a < b and not (nb * bc <= a and b <= ke * bc): bad('block coverage')
def windows():
    return [(0, 0), (0, 5), (7, 0), (30, 30), (100, 1), (1, 100), (B30, 0), (0, B30), (63, 64), (200, 17), (129, 0), (0, 129)]
if __name__ == '__main__':
    lo_, hi_ = int(sys.argv[1]), int(sys.argv[2])
    for ncons, bc in itertools.product((2, 3), (64, 96, 128)):
        for sq in range(lo_, hi_):
            for sk in range(1, 401):
                check(dict(sq=sq, sk=sk, causal=False, local=False, wl=0, wr=0), ncons, bc)
                check(dict(sq=sq, sk=sk, causal=True, local=False, wl=0, wr=0), ncons, bc)
                for wl, wr in windows():
                    check(dict(sq=sq, sk=sk, causal=False, local=True, wl=wl, wr=wr), ncons, bc)
                    check(dict(sq=sq, sk=sk, causal=True, local=True, wl=wl, wr=B30), ncons, bc)
    print('range', lo_, hi_, 'errs', errs, 'checked', checked, stats, flush=True)
