#!/usr/bin/env python3
"""Trace-driven simulator for trying eviction policies before writing them in
Rust. It models what `kvslice replay` does with one thread: requests in
timestamp order, prefix lookups (hits stop at the first miss), leaf-first
eviction (a block with cached children is never evicted; a parent becomes
evictable when its last child goes), never evicting the current request's
hits. Plain LRU here reproduces `kvslice replay --policy lru` to four digits.

    python3 benches/scripts/policy_sim.py benches/data/conversation_trace.jsonl lru
    python3 benches/scripts/policy_sim.py benches/data/conversation_trace.jsonl ghost --theta 0.05 0.35 0.5 1
    python3 benches/scripts/policy_sim.py benches/data/conversation_trace.jsonl lifetime
    python3 benches/scripts/policy_sim.py benches/data/conversation_trace.jsonl lifetime --sub 1 2 4 8 --shrink 0.8 0.95

Policies (see docs/EVICTION.md, "Chain admission"):
  lru       exact LRU over leaves
  ghost     chain admission with a fixed knob theta
  lifetime  chain admission with theta steered toward the lifetime that
            maximises F(L)/L of the observed return gaps
  duel      chain admission with theta steered by our hits against an
            LRU estimate from the ghost
  oracle    (offline) keeps exactly the blocks reused within --horizon
            requests, LRU among them: what better selection alone can give
  density   leaves ranked by return density per conversation turn count,
            learned from every reuse gap (DensityPolicy, the default)
  turns     (not a policy) groups requests into conversations and prints
            P(next turn | turns so far) and the gap to it
"""
import argparse
import collections
import json
import math
import random


def load(path):
    reqs = []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            reqs.append((d["timestamp"], d["hash_ids"]))
    reqs.sort(key=lambda r: r[0])  # stable, like the replay
    return [r[1] for r in reqs]


def h01(k, salt=0x9E3779B97F4A7C15):
    """A fixed hash of a block id to [0, 1)."""
    x = (k * 0xFF51AFD7ED558CCD + salt) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 33
    return x / 2**64


class Cache:
    """Leaf-first cache; the policy orders the leaves it is told about."""

    def __init__(self, cap, policy):
        self.cap, self.p = cap, policy
        self.parent = {}
        self.kids = collections.Counter()
        self.hits = self.blocks = 0

    def run(self, reqs):
        p = self.p
        for ids in reqs:
            self.blocks += len(ids)
            if hasattr(p, "request"):
                p.request()
            h = 0
            while h < len(ids) and ids[h] in self.parent:
                h += 1
            for k in ids[:h]:
                p.access(k)
            if h < len(ids):
                p.miss(ids[h])
            self.hits += h
            need = len(ids) - h
            if need > self.cap:
                continue
            held = set(ids[:h])
            free = self.cap - len(self.parent)
            while free < need:
                k = p.evict(lambda k: k not in held)
                if k is None:
                    break
                free += 1
                self.remove(k)
            if free < need:
                continue
            prev = ids[h - 1] if h > 0 else None
            for d in range(h, len(ids)):
                k = ids[d]
                self.parent[k] = prev
                # Extending a leaf continues a chain; anything else branches.
                cont = prev is not None and self.kids[prev] == 0
                if prev is not None:
                    self.kids[prev] += 1
                    if self.kids[prev] == 1:
                        p.became_parent(prev)
                p.insert(k, prev, d, cont)
                prev = k
        return self.hits / self.blocks

    def remove(self, k):
        par = self.parent.pop(k)
        if par is not None:
            self.kids[par] -= 1
            if self.kids[par] == 0:
                del self.kids[par]
                self.p.became_leaf(par)


class Lru:
    def __init__(self, cap):
        self.q = collections.OrderedDict()

    def access(self, k):
        if k in self.q:
            self.q.move_to_end(k)

    def miss(self, k):
        pass

    def insert(self, k, parent, d, cont):
        self.q[k] = 1

    def became_parent(self, k):
        self.q.pop(k, None)

    def became_leaf(self, k):
        # Its last use is older than its children's: next in line.
        self.q[k] = 1
        self.q.move_to_end(k, last=False)

    def evict(self, ok):
        for k in self.q:
            if ok(k):
                del self.q[k]
                return k
        return None


class ChainAdmission:
    """Blocks of *selected* chains live in a main LRU, the rest in a
    probation LRU that is always evicted first. A block that extends a leaf
    inherits its parent's status; a new chain (a root, or a branch off a
    block that already has children) is selected by a fixed hash coin: with
    probability q2 if its first block was seen before (a returning
    conversation, told by a ghost of past keys), else q1. One knob theta
    sets both: q2 = min(1, 2 theta), q1 = max(0, 2 theta - 1); theta = 1 is
    LRU. The ghost is a direct-mapped table of max(8 x capacity, 65536)
    (key, time) slots; time counts insertions."""

    def __init__(self, cap, theta=1.0, floor=0.0):
        self.cap = cap
        self.floor = floor * cap
        self.psize = 0
        self.P, self.M = collections.OrderedDict(), collections.OrderedDict()
        self.sel, self.acc, self.depth = {}, {}, {}
        self.G = max(8 * cap, 65536)
        self.gk, self.gt = [None] * self.G, [0] * self.G
        self.t = 0
        self.returning = False
        self.set_theta(theta)

    def set_theta(self, theta):
        self.theta = theta
        self.q2, self.q1 = min(1.0, 2 * theta), max(0.0, 2 * theta - 1)

    def ghost_get(self, k):
        i = int(h01(k, 12345) * self.G)
        return self.gt[i] if self.gk[i] == k else None

    def ghost_put(self, k):
        i = int(h01(k, 12345) * self.G)
        self.gk[i], self.gt[i] = k, self.t

    # Hooks for the steered variants.
    def on_return(self, gap, hit):
        pass

    def on_main_eviction(self, age):
        pass

    def access(self, k):
        g = self.ghost_get(k)
        # A hit on a leaf below the root is a conversation returning to its
        # retained chain: one sample per request.
        if g is not None and self.depth.get(k, 0) > 0 and (k in self.M or k in self.P):
            self.on_return(self.t - g, True)
        self.ghost_put(k)
        self.acc[k] = self.t
        for q in (self.M, self.P):
            if k in q:
                q.move_to_end(k)

    def miss(self, k):
        g = self.ghost_get(k)
        self.returning = g is not None
        if g is not None:
            self.on_return(self.t - g, False)
        self.ghost_put(k)

    def insert(self, k, parent, d, cont):
        self.t += 1
        self.depth[k] = d
        self.ghost_put(k)
        self.acc[k] = self.t
        if cont and parent in self.sel:
            s = self.sel[parent]
        else:
            s = h01(k) < (self.q2 if self.returning else self.q1)
        self.sel[k] = s
        self.psize += not s
        (self.M if s else self.P)[k] = 1
        self.tick()

    def tick(self):
        pass

    def became_parent(self, k):
        self.P.pop(k, None)
        self.M.pop(k, None)

    def became_leaf(self, k):
        q = self.M if self.sel[k] else self.P
        q[k] = 1
        q.move_to_end(k, last=False)

    def evict(self, ok):
        # Probation goes first, unless it is down to its floor.
        order = (self.M, self.P) if self.psize <= self.floor else (self.P, self.M)
        for q in order:
            for k in q:
                if ok(k):
                    del q[k]
                    self.psize -= not self.sel.pop(k)
                    self.depth.pop(k, None)
                    age = self.t - self.acc.pop(k, self.t)
                    if q is self.M:
                        self.on_main_eviction(age)
                    return k
        return None


class Lifetime(ChainAdmission):
    """theta steered so that main's mean eviction age tracks L*, the
    lifetime maximising F(L)/L for the CDF F of observed return gaps (hits
    per slot-insertion of a randomly kept chain)."""

    def __init__(self, cap, period=2048, floor=0.0, sub=1, shrink=0.8, deadband=None):
        super().__init__(cap, 1.0, floor)
        self.period, self.next = period, period
        # `sub` histogram bins per octave of gap; `shrink` theta's step down;
        # `deadband` eps: no shrink while main's lifetime already gets at
        # least (1 - eps) of the best F(L)/L (None: always compare with L*).
        self.sub, self.shrink, self.deadband = sub, shrink, deadband
        self.best = 0.0
        self.hist = collections.Counter()
        self.ages = []

    def on_return(self, gap, hit):
        self.hist[math.floor(math.log2(max(1, gap)) * self.sub) + 1] += 1

    def on_main_eviction(self, age):
        self.ages.append(age)

    def lstar(self):
        tot = sum(self.hist.values())
        if tot < 50:
            return None
        best, arg, cum = -1.0, None, 0
        for b in sorted(self.hist):
            cum += self.hist[b]
            v = cum / 2 ** (b / self.sub)
            if v > best:
                best, arg = v, 2 ** (b / self.sub)
        self.best = best
        return arg

    def value(self, life):
        """F(life)/life from the histogram (life's whole bin counted)."""
        b = math.floor(math.log2(max(1, life)) * self.sub) + 1
        return sum(c for k, c in self.hist.items() if k <= b) / max(1.0, life)

    def tick(self):
        if self.t < self.next:
            return
        self.next = self.t + self.period
        target = self.lstar()
        if target is None:
            return
        life = sum(self.ages) / len(self.ages) if self.ages else math.inf
        if (
            self.deadband is not None
            and life < target
            and self.value(life) >= (1 - self.deadband) * self.best
        ):
            self.ages = []
            return
        self.set_theta(max(0.01, min(1.0, self.theta * (self.shrink if life < target else 1.25))))
        self.ages = []


class Duel(ChainAdmission):
    """theta steered by returning-conversation hits: ours against LRU's
    estimated from the ghost (an LRU would still hold a block last used
    fewer than `capacity` insertions ago)."""

    def __init__(self, cap, period=2048):
        super().__init__(cap, 1.0)
        self.period, self.next = period, period
        self.ours = self.lru = 0

    def on_return(self, gap, hit):
        self.ours += hit
        self.lru += gap < self.cap

    def tick(self):
        if self.t < self.next:
            return
        self.next = self.t + self.period
        if self.ours + self.lru:
            up = self.ours < self.lru
            self.set_theta(max(0.05, min(1.0, self.theta * (1.25 if up else 0.8))))
        self.ours = self.lru = 0


class KeptSetOracle(ChainAdmission):
    """Not online: selects a block iff it will be used again within
    `horizon` requests (LRU within the selected set), to bound what better
    selection alone can give."""

    def __init__(self, cap, reqs, horizon):
        super().__init__(cap, 1.0)
        self.reqs, self.horizon, self.r = reqs, horizon, -1
        self.next_use = self.future(reqs)

    @staticmethod
    def future(reqs):
        last, nxt = {}, [None] * len(reqs)
        for r in range(len(reqs) - 1, -1, -1):
            nxt[r] = {k: last.get(k, math.inf) for k in reqs[r]}
            for k in reqs[r]:
                last[k] = r
        return nxt

    def request(self):
        self.r += 1

    def insert(self, k, parent, d, cont):
        s = self.next_use[self.r][k] - self.r <= self.horizon
        self.sel[k] = s
        (self.M if s else self.P)[k] = 1


class Density:
    """Return density, as `DensityPolicy` in core/src/evict/density.rs:
    class = turns of the block's conversation (capped at `classes`), age =
    requests since last use; per class, a histogram of every reuse gap
    (from a ghost of each key's last use, here unbounded) and the count of
    uses; density(class, age) = best over horizons L > age of returns in
    (age, L] per slot-request spent until the return or L. Evicts the
    lowest-density of `sample` random leaves (older on ties)."""

    def __init__(self, cap, classes=8, per_octave=4, period=500, decay=0.9, sample=64, seed=1):
        self.C, self.PO, self.period, self.decay, self.S = classes, per_octave, period, decay, sample
        self.NB = 20 * per_octave + 1
        self.x = [2 ** (b / per_octave) - 1 for b in range(self.NB)]
        self.rng = random.Random(seed)
        self.t = 0
        self.last, self.turns, self.depth = {}, {}, {}
        self.seen = {}  # key -> (time of last use, turns then)
        self.leaves, self.pos = [], {}
        self.R = [[0.0] * self.NB for _ in range(classes)]
        self.N = [0.0] * classes
        self.D = [[1.0 / (b + 1) for b in range(self.NB)] for _ in range(classes)]
        self.cur, self.touched = 0, []

    def cls(self, k):
        return min(self.turns.get(k, 1), self.C) - 1

    def bin(self, age):
        return min(self.NB - 1, int(math.log2(age + 1) * self.PO))

    def request(self):
        tn = self.cur + 1
        for k in self.touched:
            if k in self.last:
                self.turns[k] = max(self.turns.get(k, 1), tn)
                self.seen[k] = (self.t, self.turns[k])
                self.N[self.cls(k)] += 1
        self.touched, self.cur = [], 0
        self.t += 1
        if self.t % self.period == 0:
            self.recompute()

    def recompute(self):
        x = self.x
        for c in range(self.C):
            h = self.R[c]
            never = max(0.0, self.N[c] - sum(h))
            beyond = [0.0] * (self.NB + 1)
            for b in range(self.NB - 1, -1, -1):
                beyond[b] = beyond[b + 1] + h[b]
            for i in range(self.NB):
                best = hits = held = 0.0
                for j in range(i, self.NB):
                    hits += h[j]
                    held += h[j] * (x[j] - x[i])
                    cost = held + (beyond[j + 1] + never) * (x[j] - x[i])
                    if j > i and cost > 0:
                        best = max(best, hits / cost)
                self.D[c][i] = best
            self.R[c] = [v * self.decay for v in h]
            self.N[c] *= self.decay

    def reuse(self, k):
        s = self.seen.get(k)
        if s is not None:
            self.R[min(s[1], self.C) - 1][self.bin(self.t - s[0])] += 1

    def access(self, k):
        self.reuse(k)
        self.last[k] = self.t
        if self.depth.get(k, 0) >= 1:
            self.cur = max(self.cur, self.turns.get(k, 1))
        self.touched.append(k)

    def miss(self, k):
        s = self.seen.get(k)
        if s is not None:
            self.cur = max(self.cur, s[1])

    def insert(self, k, parent, d, cont):
        self.reuse(k)
        self.last[k], self.depth[k], self.turns[k] = self.t, d, self.cur + 1
        self.touched.append(k)
        self.pos[k] = len(self.leaves)
        self.leaves.append(k)

    def unlist(self, k):
        i = self.pos.pop(k)
        last = self.leaves.pop()
        if i < len(self.leaves):
            self.leaves[i], self.pos[last] = last, i

    def became_parent(self, k):
        if k in self.pos:
            self.unlist(k)

    def became_leaf(self, k):
        if k not in self.pos:
            self.pos[k] = len(self.leaves)
            self.leaves.append(k)

    def evict(self, ok):
        n = len(self.leaves)
        cands = self.leaves if n <= self.S else [self.leaves[self.rng.randrange(n)] for _ in range(self.S)]
        best = None
        for k in cands:
            if ok(k):
                r = (self.D[self.cls(k)][self.bin(self.t - self.last[k])], self.last[k])
                if best is None or r < best[0]:
                    best = (r, k)
        if best is None:
            best = next(((None, k) for k in self.leaves if ok(k)), None)
            if best is None:
                return None
        k = best[1]
        self.unlist(k)
        del self.last[k]
        self.depth.pop(k, None)
        self.turns.pop(k, None)
        return k


def turns(reqs):
    """A request that shares more than the root with an earlier request
    continues that request's conversation (the rule DensityPolicy uses)."""
    owner, conv, times = {}, [], collections.defaultdict(list)
    for i, ids in enumerate(reqs):
        d = 0
        while d < len(ids) and ids[d] in owner:
            d += 1
        c = conv[owner[ids[d - 1]]] if d >= 2 else len(times)
        conv.append(c)
        times[c].append(i)
        for b in ids:
            owner[b] = i
    print(f"{len(times)} conversations over {len(reqs)} requests")
    for k in range(1, 12):
        at = [v for v in times.values() if len(v) >= k]
        back = [v[k] - v[k - 1] for v in at if len(v) > k]
        med = sorted(back)[len(back) // 2] if back else None
        print(f"after turn {k}: {len(at)} conversations, P(next turn) {len(back) / len(at):.2f}, median gap {med} requests")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("policy", choices=["lru", "ghost", "lifetime", "duel", "oracle", "density", "turns"])
    ap.add_argument("--capacity", type=int, nargs="+", default=[1000, 3000, 10000, 30000])
    ap.add_argument("--theta", type=float, nargs="+", default=[0.05, 0.2, 0.35, 0.5, 0.75, 1.0])
    ap.add_argument("--horizon", type=int, nargs="+", default=[200, 300, 1000], help="oracle only")
    ap.add_argument("--floor", type=float, nargs="+", default=[0.0], help="probation floor, fraction of capacity (lifetime)")
    ap.add_argument("--sub", type=int, nargs="+", default=[1], help="gap-histogram bins per octave (lifetime)")
    ap.add_argument("--shrink", type=float, nargs="+", default=[0.8], help="theta's step down (lifetime; Rust ships 0.95)")
    ap.add_argument("--deadband", type=float, nargs="+", default=[None], help="no shrink within this fraction of the best F(L)/L (lifetime)")
    a = ap.parse_args()
    reqs = load(a.trace)
    if a.policy == "turns":
        return turns(reqs)
    make = {
        "lru": [("lru", Lru)],
        "ghost": [(f"ghost theta={t}", lambda c, t=t: ChainAdmission(c, t)) for t in a.theta],
        "lifetime": [
            (
                f"lifetime floor={f} sub={b} shrink={h} deadband={d}",
                lambda c, f=f, b=b, h=h, d=d: Lifetime(c, floor=f, sub=b, shrink=h, deadband=d),
            )
            for f in a.floor
            for b in a.sub
            for h in a.shrink
            for d in a.deadband
        ],
        "duel": [("duel", Duel)],
        "oracle": [
            (f"oracle horizon={h}", lambda c, h=h: KeptSetOracle(c, reqs, h)) for h in a.horizon
        ],
        "density": [("density", Density)],
    }[a.policy]
    for name, ctor in make:
        ratios = [round(Cache(c, ctor(c)).run(reqs), 4) for c in a.capacity]
        print(name, " ".join(f"{c}:{r}" for c, r in zip(a.capacity, ratios)), flush=True)


if __name__ == "__main__":
    main()
