/*
 * Two requests that share a system prompt, served through kvslice's C ABI:
 * the first computes and publishes its K/V, the second finds the shared
 * blocks in the cache and computes only its own tokens. Decode attention
 * for each request's last token is checked against a direct computation.
 *
 * Build (from the repository root, after `cargo build --release -p kvslice-capi`):
 *   cc -std=c11 -Wall -Wextra -Werror -I backends/capi/include \
 *      backends/capi/examples/prefix_reuse.c target/release/libkvslice_capi.a \
 *      -lpthread -ldl -lm -o target/prefix_reuse && target/prefix_reuse
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvslice.h"

enum { LAYERS = 1, Q_HEADS = 4, KV_HEADS = 2, DIM = 16, BLOCK = 16, PAGES = 32 };
enum { KV_ROW = KV_HEADS * DIM, Q_ROW = Q_HEADS * DIM, MAX_TOKENS = 64 };

static int failures = 0;

#define CHECK(call)                                                               \
  do {                                                                            \
    KvsStatus s_ = (call);                                                        \
    if (s_ != KVS_STATUS_OK) {                                                    \
      fprintf(stderr, "%s:%d: %s -> status %d: %s\n", __FILE__, __LINE__, #call, \
              (int)s_, kvs_last_error());                                         \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

/* What a model would compute: K/V at a position depend on the tokens up to
 * it (here, only on the token and its position, which is enough to make a
 * shared prefix's K/V equal). */
static float kv_value(int part, uint32_t token, size_t pos, int head, int d) {
  return sinf(0.37f * (float)token + 0.11f * (float)pos + 0.7f * (float)head +
              0.05f * (float)d + (part ? 1.3f : 0.0f));
}

static void fill_kv(const uint32_t *tokens, size_t start, size_t end, float *k, float *v) {
  for (size_t p = start; p < end; p++)
    for (int h = 0; h < KV_HEADS; h++)
      for (int d = 0; d < DIM; d++) {
        size_t i = (p - start) * KV_ROW + (size_t)h * DIM + (size_t)d;
        k[i] = kv_value(0, tokens[p], p, h, d);
        v[i] = kv_value(1, tokens[p], p, h, d);
      }
}

/* Softmax attention of one query token over positions 0..kv_len, from the
 * K/V definition above, in double precision. */
static void direct_attention(const uint32_t *tokens, size_t kv_len, const float *q,
                             float scale, double *out) {
  for (int h = 0; h < Q_HEADS; h++) {
    int kvh = h / (Q_HEADS / KV_HEADS);
    double scores[MAX_TOKENS], max = -INFINITY, sum = 0.0;
    for (size_t j = 0; j < kv_len; j++) {
      double s = 0.0;
      for (int d = 0; d < DIM; d++)
        s += (double)q[h * DIM + d] * (double)kv_value(0, tokens[j], j, kvh, d);
      scores[j] = s * scale;
      if (scores[j] > max) max = scores[j];
    }
    for (size_t j = 0; j < kv_len; j++) sum += (scores[j] = exp(scores[j] - max));
    for (int d = 0; d < DIM; d++) {
      double acc = 0.0;
      for (size_t j = 0; j < kv_len; j++)
        acc += scores[j] / sum * (double)kv_value(1, tokens[j], j, kvh, d);
      out[h * DIM + d] = acc;
    }
  }
}

/* Serves one request: look up its cached prefix, compute and write the
 * rest, attend for its last token, publish its full blocks. Returns the
 * number of cached blocks it found. */
static size_t serve(const char *name, KvsCoordinator coord, KvsStore store, KvsEngine engine,
                    const uint32_t *tokens, size_t n) {
  KvsPlanRequest plan = {.tokens = tokens, .n_tokens = n, .salt = (const uint8_t *)"tenant-a",
                         .salt_len = 8};
  KvsKey keys[MAX_TOKENS / BLOCK + 1];
  KvsPlanInfo info;
  CHECK(kvs_plan(coord, &plan, keys, sizeof keys / sizeof keys[0], &info));

  KvsRequest req;
  CHECK(kvs_request_begin(store, &req));
  size_t hits = 0, first = 0;
  CHECK(kvs_lookup_prefix(req, keys, info.full_blocks, n, &hits));
  CHECK(kvs_allocate(req, 0, 0, (uint32_t)(info.blocks - hits), &first));

  /* K/V of the tokens the cache did not have. */
  size_t start = hits * BLOCK;
  float k[MAX_TOKENS * KV_ROW], v[MAX_TOKENS * KV_ROW];
  fill_kv(tokens, start, n, k, v);
  KvsWrite write = {.layer = 0, .shard = 0, .start = start,
                    .k = k, .k_len = (n - start) * KV_ROW,
                    .v = v, .v_len = (n - start) * KV_ROW};
  CHECK(kvs_write_kv(engine, req, &write));

  /* Decode attention for the last token, against the direct computation. */
  float q[Q_ROW], out[Q_ROW];
  for (int i = 0; i < Q_ROW; i++) q[i] = cosf(0.2f * (float)i + (float)n);
  float scale = 1.0f / sqrtf((float)DIM);
  KvsSeq seq = {.request = req, .kv_len = n, .q_len = 1};
  KvsAttend attend = {.layer = 0, .shard = 0, .scale = scale, .seqs = &seq, .n_seqs = 1,
                      .q = q, .q_len = Q_ROW, .out = out, .out_len = Q_ROW};
  CHECK(kvs_attend(engine, &attend));
  double expect[Q_ROW], worst = 0.0;
  direct_attention(tokens, n, q, scale, expect);
  for (int i = 0; i < Q_ROW; i++) {
    double err = fabs((double)out[i] - expect[i]);
    if (err > worst) worst = err;
  }
  int ok = worst < 1e-4;
  failures += !ok;

  /* Publish the full blocks not cached yet, in order (each after its
   * parent); the partial tail's page is released with the request. */
  for (size_t b = hits; b < info.full_blocks; b++) {
    uint32_t page;
    CHECK(kvs_publish(req, b, &keys[b], BLOCK, &page));
  }
  printf("%s: %zu tokens, %zu blocks (%zu full), %zu cached blocks reused, %zu tokens computed; "
         "decode attention max |error| %.2e against the direct computation: %s\n",
         name, n, info.blocks, info.full_blocks, hits, n - start, worst, ok ? "ok" : "FAILED");
  CHECK(kvs_request_end(req));
  return hits;
}

int main(void) {
  KvsLayoutSpec spec = {.num_layers = LAYERS, .num_q_heads = Q_HEADS, .num_kv_heads = KV_HEADS,
                        .head_dim = DIM, .block_tokens = BLOCK, .dtype = KVS_DTYPE_F32};
  KvsLayout layout;
  CHECK(kvs_layout_new(&spec, &layout));
  KvsLayoutInfo li;
  CHECK(kvs_layout_info(layout, &li));

  /* The runtime owns the page memory: one arena, 64 bytes of slack. */
  size_t bytes = PAGES * li.page_bytes + 64;
  void *arena = malloc(bytes);
  if (!arena) return 1;
  KvsMemory memory;
  CHECK(kvs_memory_wrap(arena, bytes, &memory));

  static const uint8_t secret[16] = "deployment-key!";
  KvsCoordinator coord;
  CHECK(kvs_coordinator_new(layout, &secret, &coord));
  KvsStore store;
  /* With a ring of 256 KV events, for a prefix-aware router. */
  CHECK(kvs_store_new_with_events(layout, PAGES, "default", memory, 256, KVS_MEDIUM_CPU, &store));
  KvsEngine engine;
  CHECK(kvs_engine_new(0, &engine));

  /* A 32-token system prompt (two blocks), then each user's turn. */
  uint32_t a[MAX_TOKENS], b[MAX_TOKENS];
  for (uint32_t i = 0; i < 32; i++) a[i] = b[i] = 1000 + i;
  for (uint32_t i = 32; i < 42; i++) a[i] = 2000 + i;
  for (uint32_t i = 32; i < 39; i++) b[i] = 3000 + i;
  size_t first_hits = serve("request A", coord, store, engine, a, 42);
  size_t second_hits = serve("request B", coord, store, engine, b, 39);
  if (first_hits != 0 || second_hits != 2) {
    fprintf(stderr, "expected 0 then 2 cached blocks, got %zu then %zu\n", first_hits,
            second_hits);
    failures++;
  }

  KvsStats stats;
  CHECK(kvs_store_stats(store, &stats));
  printf("store: %llu lookups, %llu hit blocks, %llu inserts, %u of %u pages free\n",
         (unsigned long long)stats.lookups, (unsigned long long)stats.hit_blocks,
         (unsigned long long)stats.inserts, stats.free_pages, stats.capacity);

  /* What a router is told: one event per block stored or evicted. */
  KvsEvent events[64];
  size_t n_events;
  CHECK(kvs_events_drain(store, events, 64, &n_events));
  unsigned long long stored = 0, removed = 0;
  for (size_t i = 0; i < n_events; i++) {
    stored += events[i].kind == KVS_EVENT_STORED;
    removed += events[i].kind == KVS_EVENT_REMOVED;
  }
  KvsEventStats es;
  CHECK(kvs_events_stats(store, &es));
  printf("events: %llu stored, %llu removed, %llu dropped\n", stored, removed,
         (unsigned long long)es.dropped);
  if (stored != stats.inserts || es.dropped != 0) {
    fprintf(stderr, "expected one stored event per insert (%llu)\n",
            (unsigned long long)stats.inserts);
    failures++;
  }

  /* Bad input is a status and a message, never a crash. */
  size_t hits;
  KvsRequest req;
  CHECK(kvs_request_begin(store, &req));
  KvsStatus s = kvs_lookup_prefix(req, NULL, 3, 48, &hits);
  printf("null keys: status %d (%s)\n", (int)s, kvs_last_error());
  failures += s != KVS_STATUS_NULL_POINTER;
  CHECK(kvs_request_end(req));
  s = kvs_request_end(req);
  printf("request ended twice: status %d (%s)\n", (int)s, kvs_last_error());
  failures += s != KVS_STATUS_INVALID_HANDLE;
  s = kvs_memory_destroy(memory);
  printf("memory destroyed under its store: status %d (%s)\n", (int)s, kvs_last_error());
  failures += s != KVS_STATUS_BUSY;

  CHECK(kvs_engine_destroy(engine));
  CHECK(kvs_store_destroy(store));
  CHECK(kvs_memory_destroy(memory));
  CHECK(kvs_coordinator_destroy(coord));
  CHECK(kvs_layout_destroy(layout));
  free(arena);
  printf("%s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
