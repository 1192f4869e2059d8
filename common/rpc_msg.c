/* rpc_msg.c — status-code mapping, protobuf-c ↔ gRPC byte buffer conversion, credentials and
 * channel arguments for the gRPC call layer. */
#include "common/rpc_internal.h"

#include "common/errors.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

int rpc_code_to_dpc(int code) {
  switch (code) {
  case RPC_OK: return 0;
  case RPC_CANCELLED: return DPC_ECANCELED;
  case RPC_INVALID_ARGUMENT: return DPC_EINVAL;
  case RPC_DEADLINE_EXCEEDED: return DPC_ETIMEDOUT;
  case RPC_NOT_FOUND: return DPC_ENOENT;
  case RPC_ALREADY_EXISTS: return DPC_EEXIST;
  case RPC_PERMISSION_DENIED: return DPC_EPERM;
  case RPC_RESOURCE_EXHAUSTED: return DPC_ERANGE;
  case RPC_FAILED_PRECONDITION: return DPC_ESTATE;
  case RPC_ABORTED: return DPC_ESTATE;
  case RPC_OUT_OF_RANGE: return DPC_ERANGE;
  case RPC_UNIMPLEMENTED: return DPC_EUNSUPPORTED;
  case RPC_UNAVAILABLE: return DPC_EUNAVAILABLE;
  case RPC_DATA_LOSS: return DPC_ECHECKSUM;
  case RPC_UNAUTHENTICATED: return DPC_EAUTH;
  default: return DPC_EINTERNAL; /* UNKNOWN, INTERNAL, anything outside the table */
  }
}

int rpc_code_from_dpc(int rc) {
  switch (rc) {
  case 0: return RPC_OK;
  case DPC_EINVAL: case DPC_EFORMAT: case DPC_ESHAPE: case DPC_ENUMERIC:
    return RPC_INVALID_ARGUMENT;
  case DPC_ENOENT: return RPC_NOT_FOUND;
  case DPC_ERANGE: return RPC_OUT_OF_RANGE;
  case DPC_ECHECKSUM: return RPC_DATA_LOSS;
  case DPC_EUNSUPPORTED: return RPC_UNIMPLEMENTED;
  case DPC_EEXIST: return RPC_ALREADY_EXISTS;
  case DPC_ESTATE: return RPC_FAILED_PRECONDITION;
  case DPC_EAUTH: return RPC_UNAUTHENTICATED;
  case DPC_EPERM: return RPC_PERMISSION_DENIED;
  case DPC_ETIMEDOUT: return RPC_DEADLINE_EXCEEDED;
  case DPC_ECANCELED: return RPC_CANCELLED;
  case DPC_EUNAVAILABLE: return RPC_UNAVAILABLE;
  case DPC_ENOMEM: return RPC_RESOURCE_EXHAUSTED;
  default: return RPC_INTERNAL; /* EIO, EBACKEND, EINTERNAL, unknown */
  }
}

const char *rpc_code_name(int code) {
  static const char *names[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (code < 0 || code >= (int)(sizeof names / sizeof names[0])) return "UNKNOWN_CODE";
  return names[code];
}

struct grpc_byte_buffer *rpc_msg_pack(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  grpc_slice sl = grpc_slice_malloc(n);
  size_t w = protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(sl));
  if (w != n) {
    grpc_slice_unref(sl);
    return NULL;
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}

size_t rpc_msg_len(const struct grpc_byte_buffer *m) {
  return m ? grpc_byte_buffer_length((grpc_byte_buffer *)m) : 0;
}

void rpc_msg_free(struct grpc_byte_buffer *m) {
  if (m) grpc_byte_buffer_destroy(m);
}

int rpc_msg_unpack(const struct grpc_byte_buffer *m, const ProtobufCMessageDescriptor *desc,
                   size_t max_bytes, ProtobufCMessage **out) {
  *out = NULL;
  if (!m) return dpc_err(DPC_EINVAL, "%s: no message", desc->name);
  if (max_bytes == 0) max_bytes = RPC_MAX_MSG_DEFAULT;
  size_t n = grpc_byte_buffer_length((grpc_byte_buffer *)m);
  if (n > max_bytes)
    return dpc_err(DPC_ERANGE, "%s: message of %zu bytes exceeds the limit of %zu", desc->name,
                   n, max_bytes);
  const grpc_slice_buffer *sb = &m->data.raw.slice_buffer;
  ProtobufCMessage *msg;
  if (m->type == GRPC_BB_RAW && m->data.raw.compression == GRPC_COMPRESS_NONE && sb->count == 1) {
    msg = protobuf_c_message_unpack(desc, NULL, n, GRPC_SLICE_START_PTR(sb->slices[0]));
  } else {
    /* Several slices (or a compressed buffer): gather into one contiguous copy. */
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, (grpc_byte_buffer *)m))
      return dpc_err(DPC_EFORMAT, "%s: cannot read message", desc->name);
    grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    if (GRPC_SLICE_LENGTH(all) > max_bytes) {
      grpc_slice_unref(all);
      return dpc_err(DPC_ERANGE, "%s: message exceeds the limit of %zu bytes", desc->name,
                     max_bytes);
    }
    msg = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
  }
  if (!msg) return dpc_err(DPC_EFORMAT, "%s: malformed message (%zu bytes)", desc->name, n);
  *out = msg;
  return 0;
}

int rpc_creds_server(const struct rpc_tls *tls, grpc_server_credentials **out) {
  *out = NULL;
  if (tls) return dpc_err(DPC_EUNSUPPORTED, "rpc: TLS is not implemented yet (server)");
  *out = grpc_insecure_server_credentials_create();
  return *out ? 0 : dpc_err(DPC_EINTERNAL, "rpc: cannot create server credentials");
}

int rpc_creds_channel(const struct rpc_tls *tls, grpc_channel_credentials **out) {
  *out = NULL;
  if (tls) return dpc_err(DPC_EUNSUPPORTED, "rpc: TLS is not implemented yet (channel)");
  *out = grpc_insecure_credentials_create();
  return *out ? 0 : dpc_err(DPC_EINTERNAL, "rpc: cannot create channel credentials");
}

void rpc_args_init(struct rpc_args *a, size_t max_msg_bytes, int own_connection) {
  if (max_msg_bytes == 0) max_msg_bytes = RPC_MAX_MSG_DEFAULT;
  if (max_msg_bytes > (size_t)(1u << 30)) max_msg_bytes = (size_t)1 << 30;
  memset(a, 0, sizeof *a);
  size_t n = 0;
  a->arg[n].type = GRPC_ARG_INTEGER;
  a->arg[n].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  a->arg[n++].value.integer = (int)max_msg_bytes;
  a->arg[n].type = GRPC_ARG_INTEGER;
  a->arg[n].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  a->arg[n++].value.integer = (int)max_msg_bytes;
  a->arg[n].type = GRPC_ARG_INTEGER;
  a->arg[n].key = GRPC_ARG_ALLOW_REUSEPORT;
  a->arg[n++].value.integer = 0;
  if (own_connection) {
    a->arg[n].type = GRPC_ARG_INTEGER;
    a->arg[n].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    a->arg[n++].value.integer = 1;
  }
  a->set.num_args = n;
  a->set.args = a->arg;
}

gpr_timespec rpc_deadline(int timeout_ms) {
  if (timeout_ms <= 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

void rpc_tune_malloc(void) {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}
