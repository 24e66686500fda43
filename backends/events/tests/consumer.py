"""An independent consumer of kvslice's KV events: pyzmq, msgpack and
msgspec only.

Subscribes to the publisher, keeps every batch by sequence number, and when
told the last sequence number on stdin ("done N") asks the replay socket for
any it missed, applies all in order and prints the blocks it believes the
store holds, as JSON. Every batch is also decoded with msgspec into structs
of vLLM's array-encoded KV event schema, as a vLLM-shaped router would, and
must agree with the plain msgpack reading.
"""

import json
import sys
import time

import msgpack
import msgspec
import zmq


class Event(msgspec.Struct, array_like=True, tag=True):
    """vLLM's array-encoded KV cache event: the class name is the tag."""


class BlockStored(Event):
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(Event):
    block_hashes: list[bytes]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(Event):
    pass


class EventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


vllm_decoder = msgspec.msgpack.Decoder(EventBatch)

pub_endpoint, replay_endpoint = sys.argv[1], sys.argv[2]
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.connect(pub_endpoint)
poller = zmq.Poller()
poller.register(sub, zmq.POLLIN)
poller.register(sys.stdin, zmq.POLLIN)
print("ready", flush=True)

batches = {}
last = None
live = 0
deadline = time.monotonic() + 60
while last is None and time.monotonic() < deadline:
    ready = dict(poller.poll(100))
    if sub in ready:
        _topic, seq, payload = sub.recv_multipart()
        batches[int.from_bytes(seq, "big")] = payload
        live += 1
    if sys.stdin.fileno() in ready or sys.stdin in ready:
        words = sys.stdin.readline().split()
        if words[:1] == ["done"]:
            last = int(words[1])
# Whatever arrives before the replay answers is kept too.
while True:
    ready = dict(poller.poll(200))
    if sub not in ready:
        break
    _topic, seq, payload = sub.recv_multipart()
    batches[int.from_bytes(seq, "big")] = payload
    live += 1

missing = [s for s in range(last + 1) if s not in batches]
replayed = 0
if missing:
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_endpoint)
    # As vLLM's replay socket expects: an empty delimiter, then the start.
    dealer.send_multipart([b"", min(missing).to_bytes(8, "big")])
    while dealer.poll(10_000):
        _delimiter, seq, payload = dealer.recv_multipart()
        seq = int.from_bytes(seq, "big", signed=True)
        if seq == -1:
            break
        if seq not in batches:
            replayed += 1
        batches[seq] = payload
still_missing = [s for s in range(last + 1) if s not in batches]

blocks = set()
cleared = 0
kinds = {}
vllm_schema = 0
for seq in range(last + 1):
    if seq not in batches:
        continue
    _ts, events, _rank = msgpack.unpackb(batches[seq], raw=False)
    typed = vllm_decoder.decode(batches[seq])
    assert len(typed.events) == len(events), seq
    for plain, event in zip(events, typed.events):
        assert type(event).__name__ == plain[0], (seq, plain[0])
        if plain[0] != "AllBlocksCleared":
            assert event.block_hashes == plain[1], seq
            assert event.group_idx == (plain[9] if plain[0] == "BlockStored" else plain[3])
    vllm_schema += 1
    for event in events:
        kind = event[0]
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == "BlockStored":
            hashes, group, shard = event[1], event[9], event[12]
            for h in hashes:
                blocks.add((h.hex(), group, shard))
        elif kind == "BlockRemoved":
            hashes, group, shard = event[1], event[3], event[4]
            for h in hashes:
                blocks.discard((h.hex(), group, shard))
        elif kind == "AllBlocksCleared":
            blocks.clear()
            cleared += 1

print(json.dumps({
    "blocks": sorted(blocks),
    "live": live,
    "replayed": replayed,
    "missing": still_missing,
    "cleared": cleared,
    "vllm_schema_batches": vllm_schema,
    "kinds": kinds,
}), flush=True)
