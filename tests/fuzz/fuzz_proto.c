/* fuzz_proto.c — libFuzzer target: every protobuf message of the wire API (proto/dipaco.proto)
 * through rpc_msg_unpack (common/rpc_msg.c) — what the coordinator's handlers and the
 * worker/dipacoctl clients run on each received message — and then the validation that is
 * reachable without a running server: CreateJobRequest.spec_json through jobspec_parse /
 * jobspec_validate (coordinator/jobspec.c). The handlers' other field checks are inline in
 * the coordinator's handler files (coordinator/svc_*.c, admin_*.c) and need a live
 * coordinator (store, calls), so they are covered by the daemon tests, not here.
 * Input byte 0 picks the message type, byte 1 how the bytes are cut into slices, the rest is
 * the message. Oracles: the sliced (gathering) path of rpc_msg_unpack accepts exactly what
 * protobuf-c accepts from one contiguous buffer; an accepted message passes
 * protobuf_c_message_check, packs, and re-packing its unpacked packing is byte-identical. */
#include "util.h"

#include "common/errors.h"
#include "common/rpc.h"
#include "coordinator/jobspec.h"
#include "proto/dipaco.pb-c.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <stdlib.h>
#include <string.h>

static const ProtobufCMessageDescriptor *const k_desc[] = {
#include "fuzz_proto_list.h" /* every message of proto/dipaco.proto, in file order */
};
#define N_DESC (sizeof k_desc / sizeof k_desc[0])

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  grpc_init();
  return 0;
}

/* 1 if m or a message inside it kept unknown fields. protobuf-c accepts and keeps some that it
 * cannot write back in a form it reads again (a key with field number 0, sent as a padded
 * varint, e.g. 82 00 00), so the re-pack oracle applies only to messages without them. */
static int has_unknown(const ProtobufCMessage *m) {
  if (m->n_unknown_fields) return 1;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
        *(const uint32_t *)((const char *)m + f->quantifier_offset) != f->id)
      continue; /* another member of the oneof is set */
    const char *base = (const char *)m + f->offset;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
      ProtobufCMessage *const *arr = *(ProtobufCMessage *const *const *)base;
      for (size_t k = 0; k < n; k++)
        if (arr[k] && has_unknown(arr[k])) return 1;
    } else {
      const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)base;
      if (sub && has_unknown(sub)) return 1;
    }
  }
  return 0;
}

static uint8_t *pack(const ProtobufCMessage *m, size_t *n) {
  *n = protobuf_c_message_get_packed_size(m);
  uint8_t *p = malloc(*n ? *n : 1);
  if (protobuf_c_message_pack(m, p) != *n) fz_fail("%s: pack size differs", m->descriptor->name);
  return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  const ProtobufCMessageDescriptor *d = k_desc[data[0] % N_DESC];
  const uint8_t *msg = data + 2;
  size_t n = size - 2;
  struct grpc_byte_buffer *bb = fz_byte_buffer(msg, n, data[1]);
  ProtobufCMessage *m = NULL;
  int rc = rpc_msg_unpack(bb, d, 0, &m);
  grpc_byte_buffer_destroy(bb);
  ProtobufCMessage *ref = protobuf_c_message_unpack(d, NULL, n, msg);
  if ((rc == 0) != (ref != NULL)) fz_fail("%s: rpc_msg_unpack %d, protobuf-c %s", d->name, rc, ref ? "ok" : "fails");
  if (ref) protobuf_c_message_free_unpacked(ref, NULL);
  if (rc != 0) return 0;
  if (!protobuf_c_message_check(m)) fz_fail("%s: unpacked message fails protobuf_c_message_check", d->name);
  size_t n1, n2;
  uint8_t *p1 = pack(m, &n1);
  if (!has_unknown(m)) {
    ProtobufCMessage *m2 = protobuf_c_message_unpack(d, NULL, n1, p1);
    if (!m2) fz_fail("%s: packed message does not unpack", d->name);
    uint8_t *p2 = pack(m2, &n2);
    if (n1 != n2 || memcmp(p1, p2, n1) != 0) fz_fail("%s: pack(unpack(pack(m))) != pack(m)", d->name);
    free(p2);
    protobuf_c_message_free_unpacked(m2, NULL);
  }
  free(p1);
  if (d == &dipaco__v1__create_job_request__descriptor) {
    const Dipaco__V1__CreateJobRequest *r = (const Dipaco__V1__CreateJobRequest *)m;
    jobspec *js = malloc(sizeof *js);
    if (jobspec_parse(r->spec_json, strlen(r->spec_json), js) == 0 && jobspec_validate(js) != 0)
      fz_fail("spec_json accepted by jobspec_parse but not jobspec_validate: %s", dpc_errmsg());
    free(js);
  }
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
