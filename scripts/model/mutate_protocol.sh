#!/usr/bin/env bash
# Each mutation of wgmma_protocol.py's consumer must make the model fail (fails > 0): the model
# can catch the defects it claims to. Run from scripts/model.
set -uo pipefail
cd "$(dirname "$0")"
m() { python3 - "$1" "$2" <<'PY'
import sys; s=open('wgmma_protocol.py').read(); a,b=sys.argv[1],sys.argv[2]; assert a in s, a; open('/tmp/wgmma_protocol_mut.py','w').write(s.replace(a,b,1))
PY
PYTHONPATH="$PWD" python3 /tmp/wgmma_protocol_mut.py 2000 3 | tail -1; }
echo "no turn in pass:"; m "                    w = turn_wait()
                    if w: yield w
                    turn_pass()
                    useK(n); relK(n)" "                    useK(n); relK(n)"
echo "release K before full wait in pass:"; m "                    yield kfull(n)
                    w = turn_wait()" "                    useK(n) if False else None; relK(n)
                    yield kfull(n)
                    w = turn_wait()"
echo "pass one fewer after:"; m "yield from pass_tiles(n_blocks - lead - n_mine); it += n_blocks - lead - n_mine" "yield from pass_tiles(max(n_blocks - lead - n_mine - 1, 0)); it += max(n_blocks - lead - n_mine - 1,0)"
echo "no q_empty for empty consumer in !O_OWN:"; m "if not O_OWN: holdQ.discard(c); arrive('q_empty', 1, rnd, me)
                continue" "continue"
echo "O_OWN extra q_empty when has_rows false:"; m "if not O_OWN: holdQ.discard(c); arrive('q_empty', 1, rnd, me)
                continue" "holdQ.discard(c); arrive('q_empty', 1, rnd, me)
                continue"
