/* fuzz_chunk.c — libFuzzer target: the hand-written dipaco.v1.Chunk decoder
 * (rpc_chunk_parse / rpc_chunk_copy, common/rpc_chunk.c). Input byte 0 picks how the message
 * is cut into slices (fz_byte_buffer), the rest is the message. Oracles: an accepted chunk's
 * data range lies in the message and rpc_chunk_copy returns exactly those bytes; where
 * protobuf-c also accepts the bytes, every field agrees with its decoding; re-encoding the
 * parsed chunk (rpc_chunk_encode) parses back to the same header and data. */
#include "util.h"

#include "common/rpc.h"
#include "proto/dipaco.pb-c.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  grpc_init();
  return 0;
}

static void same_header(const struct rpc_chunk *a, const struct rpc_chunk *b, const char *what) {
  if (a->lease_id != b->lease_id || a->fragment_id != b->fragment_id || a->version != b->version ||
      a->offset != b->offset || a->total != b->total || a->codec != b->codec || a->crc32c != b->crc32c ||
      a->num_floats != b->num_floats || a->block_floats != b->block_floats || a->inner_steps != b->inner_steps ||
      a->tokens != b->tokens || a->payload != b->payload || a->step != b->step || a->len != b->len)
    fz_fail("%s: chunk headers differ", what);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t *msg = data + 1;
  size_t n = size - 1;
  struct grpc_byte_buffer *bb = fz_byte_buffer(msg, n, data[0]);
  struct rpc_chunk ch;
  int rc = rpc_chunk_parse(bb, &ch);
  if (rc == 0) {
    if (ch.data_pos > n || ch.len > n - ch.data_pos) fz_fail("data range outside the message");
    if (ch.offset > ch.total || ch.len > ch.total - ch.offset) fz_fail("offset + len > total accepted");
    uint8_t *buf = malloc(ch.len ? ch.len : 1);
    if (rpc_chunk_copy(bb, &ch, buf) != 0) fz_fail("rpc_chunk_copy failed on a parsed chunk");
    if (ch.len && memcmp(buf, msg + ch.data_pos, ch.len) != 0) fz_fail("copied data differs");

    Dipaco__V1__Chunk *pc = dipaco__v1__chunk__unpack(NULL, n, msg);
    if (pc) {
      struct rpc_chunk ref = {.lease_id = pc->lease_id, .fragment_id = pc->fragment_id, .version = pc->version,
                              .offset = pc->offset, .total = pc->total, .codec = (uint32_t)pc->codec,
                              .crc32c = pc->crc32c, .num_floats = pc->num_floats,
                              .block_floats = pc->block_floats, .inner_steps = pc->inner_steps,
                              .tokens = pc->tokens, .payload = (uint32_t)pc->payload, .step = pc->step,
                              .len = pc->data.len};
      same_header(&ch, &ref, "rpc_chunk_parse vs protobuf-c");
      if (pc->data.len && memcmp(pc->data.data, buf, pc->data.len) != 0) fz_fail("data differs from protobuf-c");
      dipaco__v1__chunk__free_unpacked(pc, NULL);
    }

    struct grpc_byte_buffer *re = rpc_chunk_encode(&ch, buf, NULL, NULL);
    if (!re) fz_fail("rpc_chunk_encode failed");
    struct rpc_chunk ch2;
    if (rpc_chunk_parse(re, &ch2) != 0) fz_fail("re-encoded chunk does not parse");
    same_header(&ch, &ch2, "re-encoded");
    uint8_t *buf2 = malloc(ch2.len ? ch2.len : 1);
    if (rpc_chunk_copy(re, &ch2, buf2) != 0 || (ch.len && memcmp(buf, buf2, ch.len) != 0))
      fz_fail("re-encoded data differs");
    free(buf2);
    grpc_byte_buffer_destroy(re);
    free(buf);
  }
  /* A header that does not match the message must be refused, never read out of bounds. */
  struct rpc_chunk bad = {.data_pos = n, .len = 1};
  uint8_t one;
  if (rpc_chunk_copy(bb, &bad, &one) == 0) fz_fail("copy past the end accepted");
  grpc_byte_buffer_destroy(bb);
  return 0;
}
