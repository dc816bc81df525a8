# Model of attn_common.cuh key_lo/key_hi/key_tiles_of and attn_wgmma.cu's per-consumer range
# (lead, n_mine) + softmax mask decision; exhaustive check of coverage and mask correctness.
import sys, itertools
B30 = 1 << 30
def clamp_keys(x, sk): return -B30 if x < -B30 else (sk if x > sk else x)
def cdiv(a, b):  # C int division truncates toward zero; args here are >= 0
    assert a >= 0 and b > 0; return a // b
def key_hi(P, i):
    if not P['causal'] and not P['local']: return P['sk']
    right = 0 if P['causal'] else P['wr']
    return clamp_keys(i + P['sk'] - P['sq'] + 1 + right, P['sk'])
def key_lo(P, i):
    if not P['local']: return -B30
    return clamp_keys(i + P['sk'] - P['sq'] - P['wl'], P['sk'])
def key_tiles_of(P, row0, rows, bc):
    lo_first = max(key_lo(P, row0), 0); lo_last = max(key_lo(P, row0 + rows - 1), 0)
    hi_first = max(key_hi(P, row0), 0); hi_last = max(key_hi(P, row0 + rows - 1), 0)
    b = cdiv(lo_first, bc); e = max(cdiv(hi_last + bc - 1, bc), b)
    ib = min(max(cdiv(lo_last + bc - 1, bc), b), e); ie = max(min(cdiv(hi_first, bc), e), ib)
    return b, e, ib, ie
def block_row0(P, mb, BR):  # attn_wgmma.cu block_row0: causal puts the partial block first
    nmb = (P['sq'] + BR - 1) // BR
    shift = (nmb * BR - P['sq']) // 64 * 64 if P['causal'] else 0
    return mb * BR - shift
def block_tiles(P, row0, BR, bc):  # attn_wgmma.cu key_tiles: the block's rows from row 0 on
    first = max(row0, 0)
    return key_tiles_of(P, first, row0 + BR - first, bc)
def visible(P, i, j):  # reference (src/scores.rs)
    if not (0 <= j < P['sk']): return False
    d = P['sk'] - P['sq']
    if P['causal'] and j > i + d: return False
    if P['local']:
        if j < i + d - P['wl']: return False
        if not P['causal'] and j > i + d + P['wr']: return False
    return True
def kernel_mask(P, row0, i, j):  # softmax()'s per-row mask for row i, key j (mask tile)
    lim_block = key_hi(P, row0); lo_block = key_lo(P, row0); off = i - row0
    hi = min(lim_block + off, P['sk']) if (P['causal'] or P['local']) else P['sk']
    lo = lo_block + off if P['local'] else -B30
    return lo <= j < hi
errs = 0; checked = 0
def check(P, ncons, bc):
    global errs, checked
    BR = 64 * ncons; sq, sk = P['sq'], P['sk']
    nmb = (sq + BR - 1) // BR
    for mb in range(nmb):
        row0 = block_row0(P, mb, BR)
        nb, ke, ib, ie = block_tiles(P, row0, BR, bc); n_blocks = ke - nb
        assert n_blocks >= 0
        for c in range(ncons):
            crow0 = row0 + 64 * c
            has_rows = 0 <= crow0 < sq; lead = n_mine = 0
            if has_rows:
                cb, ce, _, _ = key_tiles_of(P, crow0, min(64, sq - crow0), bc)
                lead = min(cb - nb, n_blocks); n_mine = max(min(ce, ke) - nb - lead, 0)
            rest = n_blocks - lead - n_mine
            checked += 1
            def bad(msg):
                global errs; errs += 1
                if errs < 20: print('ERR', msg, P, ncons, bc, mb, c, (nb, ke, ib, ie), lead, n_mine)
            if lead < 0 or n_mine < 0 or rest < 0: bad('counts')
            nc = nb + lead
            if has_rows and n_mine == 0 and not (sk == 0): pass
            for i in range(max(crow0, 0), min(crow0 + 64, sq)):
                # every visible key lies in this consumer's own tiles
                for j in range(sk):
                    v = visible(P, i, j)
                    t = j // bc
                    if v and not (nc <= t < nc + n_mine): bad('coverage i=%d j=%d' % (i, j)); break
                # mask decision on own tiles
                for t in range(nc, nc + n_mine):
                    mask_tile = t < ib or t >= ie
                    for j in range(t * bc, (t + 1) * bc):
                        km = kernel_mask(P, row0, i, j) if mask_tile else True
                        if km != visible(P, i, j): bad('mask i=%d j=%d t=%d mt=%d' % (i, j, t, mask_tile)); break
            # the block's keys all lie inside [nb, ke) for the block's rows < sq (producer loads them)
            for i in range(max(row0, 0), min(row0 + BR, sq)):
                for j in range(sk):
                    if visible(P, i, j) and not (nb <= j // bc < ke): bad('block coverage')
def windows(sk):
    return [(0, 0), (0, 5), (7, 0), (30, 30), (100, 1), (1, 100), (B30, 0), (0, B30), (63, 64), (200, 17)]
if __name__ == '__main__':
    step = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    lens = list(range(1, 401, step))
    if step > 1: lens = sorted(set(lens + [1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 383, 384, 385, 400]))
    for ncons, bc in itertools.product((2, 3), (64, 96, 128)):
        for sq in lens:
            for sk in lens:
                check(dict(sq=sq, sk=sk, causal=False, local=False, wl=0, wr=0), ncons, bc)
                check(dict(sq=sq, sk=sk, causal=True, local=False, wl=0, wr=0), ncons, bc)
                for wl, wr in windows(sk):
                    check(dict(sq=sq, sk=sk, causal=False, local=True, wl=wl, wr=wr), ncons, bc)
                    check(dict(sq=sq, sk=sk, causal=True, local=True, wl=wl, wr=B30), ncons, bc)
        print('done', ncons, bc, 'errs', errs, 'checked', checked, flush=True)
