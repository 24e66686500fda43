"""The C ABI from Python through ctypes (standard library only).

Usage: python3 ctypes_smoke.py path/to/libkvslice_capi.so

Plans two requests that share a prefix, publishes the first, reuses it
for the second, runs decode attention and checks it against a direct
computation in Python; then checks that bad input is a status code.
"""

import ctypes as C
import math
import sys

lib = C.CDLL(sys.argv[1])

OK, NULL_POINTER, INVALID_HANDLE, BUFFER_TOO_SMALL = 0, 1, 4, 6
F32 = 0


class Handle(C.Structure):
    _fields_ = [("id", C.c_uint64)]


class LayoutSpec(C.Structure):
    _fields_ = [(n, C.c_uint32) for n in (
        "num_layers", "num_q_heads", "num_kv_heads", "head_dim", "block_tokens",
        "dtype", "layers_per_group", "head_shards", "key_order")]


class LayoutInfo(C.Structure):
    _fields_ = [("page_bytes", C.c_size_t), ("layer_groups", C.c_uint32),
                ("head_shards", C.c_uint32), ("kv_row", C.c_uint32), ("q_row", C.c_uint32)]


class Key(C.Structure):
    _fields_ = [("block_lo", C.c_uint64), ("block_hi", C.c_uint64), ("block_index", C.c_uint32),
                ("layer_group", C.c_uint32), ("head_shard", C.c_uint32)]


class PlanRequest(C.Structure):
    _fields_ = [("tokens", C.POINTER(C.c_uint32)), ("n_tokens", C.c_size_t),
                ("salt", C.c_char_p), ("salt_len", C.c_size_t),
                ("range_start", C.c_size_t), ("range_end", C.c_size_t),
                ("layer_group", C.c_uint32), ("head_shard", C.c_uint32)]


class PlanInfo(C.Structure):
    _fields_ = [(n, C.c_size_t) for n in ("blocks", "full_blocks", "token_start", "token_end")]


class Write(C.Structure):
    _fields_ = [("layer", C.c_uint32), ("shard", C.c_uint32), ("start", C.c_size_t),
                ("k", C.POINTER(C.c_float)), ("k_len", C.c_size_t),
                ("v", C.POINTER(C.c_float)), ("v_len", C.c_size_t)]


class Seq(C.Structure):
    _fields_ = [("request", Handle), ("kv_len", C.c_size_t), ("q_len", C.c_size_t)]


class Attend(C.Structure):
    _fields_ = [("layer", C.c_uint32), ("shard", C.c_uint32), ("scale", C.c_float),
                ("seqs", C.POINTER(Seq)), ("n_seqs", C.c_size_t),
                ("q", C.POINTER(C.c_float)), ("q_len", C.c_size_t),
                ("out", C.POINTER(C.c_float)), ("out_len", C.c_size_t),
                ("window", C.c_uint32)]


class Stats(C.Structure):
    _fields_ = [(n, C.c_uint64) for n in (
        "lookups", "hit_blocks", "miss_blocks", "hit_tokens", "miss_tokens", "inserts",
        "duplicate_publishes", "evictions", "evicted_tokens", "dropped_accesses")] + [
        ("capacity", C.c_uint32), ("free_pages", C.c_uint32)]


lib.kvs_last_error.restype = C.c_char_p
for f in ("kvs_layout_new", "kvs_layout_info", "kvs_coordinator_new", "kvs_store_new",
          "kvs_engine_new", "kvs_plan", "kvs_request_begin", "kvs_lookup_prefix", "kvs_allocate",
          "kvs_write_kv", "kvs_attend", "kvs_publish", "kvs_request_end", "kvs_store_stats",
          "kvs_store_destroy", "kvs_engine_destroy", "kvs_coordinator_destroy",
          "kvs_layout_destroy"):
    getattr(lib, f).restype = C.c_int32


def check(status, what):
    if status != OK:
        raise SystemExit(f"{what}: status {status}: {lib.kvs_last_error().decode()}")


Q_HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 8, 4
KV_ROW, Q_ROW = KV_HEADS * DIM, Q_HEADS * DIM


def kv(part, token, pos, head, d):
    return math.sin(0.37 * token + 0.11 * pos + 0.7 * head + 0.05 * d + (1.3 if part else 0.0))


layout, coord, store, engine = Handle(), Handle(), Handle(), Handle()
spec = LayoutSpec(1, Q_HEADS, KV_HEADS, DIM, BLOCK, F32, 0, 0, 0)
check(lib.kvs_layout_new(C.byref(spec), C.byref(layout)), "layout")
secret = (C.c_uint8 * 16)(*range(16))
check(lib.kvs_coordinator_new(layout, C.byref(secret), C.byref(coord)), "coordinator")
check(lib.kvs_store_new(layout, 16, b"lru", Handle(0), C.byref(store)), "store")
check(lib.kvs_engine_new(1, C.byref(engine)), "engine")


def serve(tokens):
    n = len(tokens)
    toks = (C.c_uint32 * n)(*tokens)
    plan = PlanRequest(toks, n, b"py", 2, 0, 0, 0, 0)
    keys, info = (Key * 8)(), PlanInfo()
    check(lib.kvs_plan(coord, C.byref(plan), keys, 8, C.byref(info)), "plan")
    req = Handle()
    check(lib.kvs_request_begin(store, C.byref(req)), "begin")
    hits, first = C.c_size_t(), C.c_size_t()
    check(lib.kvs_lookup_prefix(req, keys, info.full_blocks, n, C.byref(hits)), "lookup")
    check(lib.kvs_allocate(req, 0, 0, info.blocks - hits.value, C.byref(first)), "allocate")
    start = hits.value * BLOCK
    ks = [kv(0, tokens[p], p, h, d) for p in range(start, n) for h in range(KV_HEADS) for d in range(DIM)]
    vs = [kv(1, tokens[p], p, h, d) for p in range(start, n) for h in range(KV_HEADS) for d in range(DIM)]
    k, v = (C.c_float * len(ks))(*ks), (C.c_float * len(vs))(*vs)
    check(lib.kvs_write_kv(engine, req, C.byref(Write(0, 0, start, k, len(ks), v, len(vs)))), "write")
    q = (C.c_float * Q_ROW)(*[math.cos(0.2 * i + n) for i in range(Q_ROW)])
    out = (C.c_float * Q_ROW)()
    scale = 1 / math.sqrt(DIM)
    seq = Seq(req, n, 1)
    check(lib.kvs_attend(engine, C.byref(Attend(0, 0, scale, C.pointer(seq), 1, q, Q_ROW, out, Q_ROW))), "attend")
    worst = 0.0
    for h in range(Q_HEADS):
        kvh = h // (Q_HEADS // KV_HEADS)
        s = [scale * sum(q[h * DIM + d] * kv(0, tokens[j], j, kvh, d) for d in range(DIM)) for j in range(n)]
        m = max(s)
        w = [math.exp(x - m) for x in s]
        total = sum(w)
        for d in range(DIM):
            expect = sum(w[j] / total * kv(1, tokens[j], j, kvh, d) for j in range(n))
            worst = max(worst, abs(out[h * DIM + d] - expect))
    assert worst < 1e-4, worst
    page = C.c_uint32()
    for b in range(hits.value, info.full_blocks):
        check(lib.kvs_publish(req, C.c_size_t(b), C.byref(keys[b]), BLOCK, C.byref(page)), "publish")
    check(lib.kvs_request_end(req), "end")
    return hits.value, worst


system = list(range(500, 508))  # two full blocks
a_hits, a_err = serve(system + [1, 2, 3])
b_hits, b_err = serve(system + [9, 9])
assert (a_hits, b_hits) == (0, 2), (a_hits, b_hits)
stats = Stats()
check(lib.kvs_store_stats(store, C.byref(stats)), "stats")
assert stats.hit_blocks == 2 and stats.inserts == 2, (stats.hit_blocks, stats.inserts)

# Bad input: a status and a message, nothing else.
hits = C.c_size_t()
req = Handle()
check(lib.kvs_request_begin(store, C.byref(req)), "begin")
assert lib.kvs_lookup_prefix(req, None, 2, 8, C.byref(hits)) == NULL_POINTER
assert b"null pointer" in lib.kvs_last_error()
check(lib.kvs_request_end(req), "end")
assert lib.kvs_request_end(req) == INVALID_HANDLE
assert lib.kvs_store_stats(Handle(12345), C.byref(stats)) == INVALID_HANDLE
small = (Key * 1)()
info = PlanInfo()
toks = (C.c_uint32 * 9)(*range(9))
plan = PlanRequest(toks, 9, None, 0, 0, 0, 0, 0)
assert lib.kvs_plan(coord, C.byref(plan), small, 1, C.byref(info)) == BUFFER_TOO_SMALL
assert info.blocks == 3, info.blocks

for f, h in (("kvs_engine_destroy", engine), ("kvs_store_destroy", store),
             ("kvs_coordinator_destroy", coord), ("kvs_layout_destroy", layout)):
    check(getattr(lib, f)(h), f)
print(f"ctypes: request A reused {a_hits} blocks, request B {b_hits}; "
      f"decode attention max |error| {max(a_err, b_err):.1e}; bad input refused with status codes: ok")
