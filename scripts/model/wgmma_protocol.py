# Random-schedule model of attn_wgmma.cu's barrier protocol after 64e18ad: producer + NCONS
# consumers (a consumer = its 4 warps moving together), mbarriers with parity waits (checked
# against the use they mean), named barriers with generations (checked for mixed arrivals),
# stage/Q/slot data tags (checked for overwrite-while-held and stale reads).
import random, sys, itertools
from key_tiles import key_tiles_of, B30
class Fail(Exception): pass
def run(tiles, NCONS, STAGES, PP, O_OWN, rng):
    # tiles: list of (n_blocks, [(has_rows, lead, n_mine)] * NCONS)
    Q_EMPTY = NCONS * 4 if O_OWN else NCONS
    mb = {}
    def mbar(name, count): mb[name] = dict(count=count, pend=count, done=0)
    mbar('q_full', 1); mbar('q_empty', Q_EMPTY)
    for s in range(STAGES):
        for k in ('k_full', 'v_full'): mbar((k, s), 1)
        for k in ('k_empty', 'v_empty'): mbar((k, s), NCONS * 4)
    def arrive(name, n=1, use=None, who=None):
        b = mb[name]
        if use is not None and b['done'] != use: raise Fail('arrival on %s for use %d while barrier at phase %d (%s)' % (name, use, b['done'], who))
        b['pend'] -= n
        if b['pend'] < 0: raise Fail('over-arrival %s' % (name,))
        if b['pend'] == 0: b['done'] += 1; b['pend'] = b['count']
    def waitp(name, u, who):
        def pred():
            d = mb[name]['done']
            if d not in (u, u + 1): raise Fail('parity wait on %s use %d with %d phases done (%s)' % (name, u, d, who))
            return (d & 1) != (u & 1)
        return pred
    nb_ = {}
    def nbar(i):
        return nb_.setdefault(i, dict(cnt=0, gen=0, who=[]))
    def named(i, need, threads, who, sync):
        b = nbar(i)
        if who in b['who']: raise Fail('named barrier %s: %s arrives twice in one generation %s' % (i, who, b['who']))
        b['cnt'] += threads; b['who'].append(who)
        if b['cnt'] > need: raise Fail('named barrier %s over count' % (i,))
        g = b['gen']
        if b['cnt'] == need:
            if i[0] == 'sched':
                c = i[1]
                ok = [sorted([('c', c), ('c', (c - 1) % NCONS)])] + ([sorted([('init',), ('c', 0)]), sorted([('c', NCONS - 1), ('final',)]), sorted([('init',), ('final',)])] if c == 0 else [])
                if sorted(b['who']) not in ok: raise Fail('sched %d completed by %s' % (c, b['who']))
            b['gen'] += 1; b['cnt'] = 0; b['who'] = []
        return (lambda: b['gen'] > g) if sync else None
    kt = {}; vt = {}; qtag = [None]; slot = [None, None]
    holdK = {}; holdV = {}; holdQ = set()
    def producer():
        g = 0; tile_i = 0
        for rnd in itertools.count():
            if rnd > 0: yield waitp('q_empty', rnd - 1, 'P')
            last = tile_i >= len(tiles)
            slot[rnd % 2] = (rnd, -1 if last else tile_i)
            for c in range(NCONS): named(('tile', c), 160, 32, 'P', False)
            if last: return
            if holdQ: raise Fail('Q overwritten while held by %s' % holdQ)
            qtag[0] = rnd; arrive('q_full')
            for n in range(tiles[tile_i][0]):
                s, u = g % STAGES, g // STAGES
                if u > 0: yield waitp(('k_empty', s), u - 1, 'P')
                if holdK.get(s): raise Fail('K stage %d overwritten while held by %s' % (s, holdK[s]))
                kt[s] = g; arrive(('k_full', s))
                if u > 0: yield waitp(('v_empty', s), u - 1, 'P')
                if holdV.get(s): raise Fail('V stage %d overwritten while held' % s)
                vt[s] = g; arrive(('v_full', s))
                g += 1
            tile_i += 1
            yield lambda: True
    def consumer(c):
        me = ('c', c)
        it = 0
        if PP and c == 0: named(('sched', 0), 256, 128, ('init',), False)
        def turn_wait():
            if PP:
                w = named(('sched', c), 256, 128, me, True)
                return w
            return None
        def turn_pass():
            if PP: named(('sched', (c + 1) % NCONS), 256, 128, me, False)
        for rnd in itertools.count():
            yield named(('tile', c), 160, 128, me, True)
            r, t = slot[rnd % 2]
            if r != rnd: raise Fail('consumer %d read slot of round %d in round %d' % (c, r, rnd))
            if t < 0:
                if PP and c == 0:
                    w = named(('sched', 0), 256, 128, ('final',), True); yield w
                return
            yield waitp('q_full', rnd, me)
            if qtag[0] != rnd: raise Fail('stale Q')
            n_blocks, per = tiles[t]; has_rows, lead, n_mine = per[c]
            holdQ.add(c)
            def kfull(n):
                return waitp(('k_full', (it + n) % STAGES), (it + n) // STAGES, me)
            def vfull(n):
                return waitp(('v_full', (it + n) % STAGES), (it + n) // STAGES, me)
            def relK(n):
                s = (it + n) % STAGES
                if kt[s] != base + it + n - it0: pass
                holdK.setdefault(s, set()).discard(c); arrive(('k_empty', s), 4, (it + n) // STAGES, me)
            def relV(n):
                s = (it + n) % STAGES
                holdV.setdefault(s, set()).discard(c); arrive(('v_empty', s), 4, (it + n) // STAGES, me)
            def useK(n):
                s = (it + n) % STAGES
                if kt[s] != it + n: raise Fail('K stage %d holds tile %d, consumer %d wants %d' % (s, kt[s], c, it + n))
                holdK.setdefault(s, set()).add(c)
            def useV(n):
                s = (it + n) % STAGES
                if vt[s] != it + n: raise Fail('V stage holds %d want %d' % (vt[s], it + n))
                holdV.setdefault(s, set()).add(c)
            base = it0 = 0
            def pass_tiles(count):
                for n in range(count):
                    yield kfull(n)
                    w = turn_wait()
                    if w: yield w
                    turn_pass()
                    useK(n); relK(n)
                    yield vfull(n)
                    useV(n); relV(n)
            yield from pass_tiles(lead); it += lead
            if n_mine > 0:
                yield kfull(0)
                w = turn_wait()
                if w: yield w
                useK(0)
                if qtag[0] != rnd: raise Fail('Q overwritten before S')
                turn_pass()
                relK(0)
                if O_OWN and n_mine == 1: holdQ.discard(c); arrive('q_empty', 4, rnd, me)
                for n in range(1, n_mine):
                    yield kfull(n)
                    w = turn_wait()
                    if w: yield w
                    useK(n)
                    if qtag[0] != rnd: raise Fail('Q overwritten before S')
                    yield vfull(n - 1)
                    useV(n - 1)
                    turn_pass()
                    relK(n)
                    if O_OWN and n == n_mine - 1: holdQ.discard(c); arrive('q_empty', 4, rnd, me)
                    yield lambda: True
                    relV(n - 1)
            if O_OWN and n_mine == 0: holdQ.discard(c); arrive('q_empty', 4, rnd, me)
            if n_mine > 0:
                yield vfull(n_mine - 1); useV(n_mine - 1); relV(n_mine - 1)
            it += n_mine
            yield from pass_tiles(n_blocks - lead - n_mine); it += n_blocks - lead - n_mine
            if not has_rows:
                if not O_OWN: holdQ.discard(c); arrive('q_empty', 1, rnd, me)
                continue
            yield lambda: True
            if not O_OWN:
                if qtag[0] != rnd: raise Fail('Q tile replaced before O store')
                holdQ.discard(c); arrive('q_empty', 1, rnd, me)
    procs = [producer()] + [consumer(c) for c in range(NCONS)]
    preds = [next(p) for p in procs]
    done = [False] * len(procs)
    steps = 0
    while not all(done):
        en = [i for i in range(len(procs)) if not done[i] and preds[i]()]
        if not en:
            raise Fail('DEADLOCK: mbar %s named %s' % ({k: v['done'] for k, v in mb.items()}, nb_))
        i = rng.choice(en)
        try: preds[i] = next(procs[i])
        except StopIteration: done[i] = True
        steps += 1
    # leftover: every named barrier empty
    for k, b in nb_.items():
        if b['cnt']: raise Fail('named barrier %s left with %d arrivals' % (k, b['cnt']))
    return steps
def real_tiles(rng, NCONS):
    bc = rng.choice([64, 96, 128]); BR = 64 * NCONS
    sq = rng.randint(1, 700); sk = rng.choice([rng.randint(0, 700), rng.randint(1, 700)])
    causal = rng.random() < 0.5; local = rng.random() < 0.4
    wl = rng.choice([0, 3, 40, 100, 200, B30]); wr = B30 if causal else rng.choice([0, 5, 70, 150, B30])
    P = dict(sq=sq, sk=sk, causal=causal, local=local, wl=wl, wr=wr)
    nmb = (sq + BR - 1) // BR
    out = []
    for _ in range(rng.randint(1, 5)):
        mbk = rng.randrange(nmb); row0 = mbk * BR
        if sk == 0: nb, ke = 0, 0
        else: nb, ke, _, _ = key_tiles_of(P, row0, BR, bc)
        per = []
        for c in range(NCONS):
            crow0 = row0 + 64 * c; has = crow0 < sq; lead = nm = 0
            if has and sk > 0:
                cb, ce, _, _ = key_tiles_of(P, crow0, min(64, sq - crow0), bc)
                lead = min(cb - nb, ke - nb); nm = max(min(ce, ke) - nb - lead, 0)
            per.append((has, lead, nm))
        out.append((ke - nb, per))
    return out
def synth_tiles(rng, NCONS):
    out = []
    for _ in range(rng.randint(1, 6)):
        n = rng.choice([0, 1, 1, 2, 3, 4, 6])
        per = []
        for c in range(NCONS):
            has = rng.random() < 0.8
            if has:
                lead = rng.randint(0, n); nm = rng.randint(0, n - lead)
            else: lead = nm = 0
            per.append((has, lead, nm))
        out.append((n, per))
    return out
if __name__ == '__main__':
    N = int(sys.argv[1]); seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    rng = random.Random(seed); fails = 0; runs = 0
    for k in range(N):
        NCONS = rng.choice([2, 3]); STAGES = rng.choice([2, 2, 3, 4]); PP = rng.random() < 0.6; O_OWN = rng.random() < 0.5
        tiles = real_tiles(rng, NCONS) if rng.random() < 0.5 else synth_tiles(rng, NCONS)
        for rep in range(3):
            runs += 1
            try: run(tiles, NCONS, STAGES, PP, O_OWN, rng)
            except Fail as e:
                fails += 1
                if fails < 10: print('FAIL', e, dict(NCONS=NCONS, STAGES=STAGES, PP=PP, O_OWN=O_OWN), tiles)
                break
    print('runs', runs, 'fails', fails)
