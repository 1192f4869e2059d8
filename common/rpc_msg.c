/* rpc_msg.c — status-code mapping, protobuf-c ↔ gRPC byte buffer conversion, credentials and
 * channel arguments for the gRPC call layer. */
#include "common/rpc_internal.h"

#include "common/errors.h"
#include "common/fsutil.h"

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

struct grpc_byte_buffer *rpc_msg_ref(const struct grpc_byte_buffer *m) {
  return grpc_byte_buffer_copy((grpc_byte_buffer *)m);
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

/* A PEM file for TLS, read whole (bounded) with a check of its form, so that a wrong path or a
 * swapped cert/key gets a clear message instead of a failed handshake later. `what` names
 * the flag; `marker` is the PEM label text that must appear (e.g. "CERTIFICATE"). */
static int read_pem(const char *path, const char *what, const char *marker, char **out) {
  *out = NULL;
  void *buf = NULL;
  size_t n = 0;
  int rc = dpc_read_file(path, 1u << 20, &buf, &n);
  if (rc) {
    char why[256];
    snprintf(why, sizeof why, "%s", dpc_errmsg()); /* dpc_err overwrites the detail */
    return dpc_err(rc, "%s %s: cannot read it (%s)", what, path, why);
  }
  const char *begin = strstr(buf, "-----BEGIN ");
  const char *m = begin ? strstr(begin, marker) : NULL;
  if (!begin || !m || strlen(buf) != n || !strstr(buf, "-----END ")) {
    free(buf);
    return dpc_err(DPC_EFORMAT, "%s %s: not a PEM file with a %s (-----BEGIN ...%s-----)", what, path, marker,
                   marker);
  }
  *out = buf;
  return 0;
}

static void free_pem(char *p) {
  if (!p) return;
  memset(p, 0, strlen(p)); /* may be a private key */
  free(p);
}

/* cert and key both or neither; reads them into *pair (both NULL when not given). */
static int read_pair(const struct rpc_tls *tls, const char *side, grpc_ssl_pem_key_cert_pair *pair) {
  char *cert = NULL, *key = NULL;
  pair->cert_chain = pair->private_key = NULL;
  if (!tls->cert_file != !tls->key_file)
    return dpc_err(DPC_EINVAL, "%s TLS: --tls-cert and --tls-key go together (one is missing)", side);
  if (!tls->cert_file) return 0;
  int rc = read_pem(tls->cert_file, "--tls-cert", "CERTIFICATE", &cert);
  if (rc == 0) rc = read_pem(tls->key_file, "--tls-key", "PRIVATE KEY", &key);
  if (rc) {
    free_pem(cert);
    return rc;
  }
  pair->cert_chain = cert;
  pair->private_key = key;
  return 0;
}

int rpc_creds_server(const struct rpc_tls *tls, grpc_server_credentials **out) {
  *out = NULL;
  if (!tls) {
    *out = grpc_insecure_server_credentials_create();
    return *out ? 0 : dpc_err(DPC_EINTERNAL, "rpc: cannot create server credentials");
  }
  if (!tls->cert_file) return dpc_err(DPC_EINVAL, "server TLS needs --tls-cert and --tls-key");
  grpc_ssl_pem_key_cert_pair pair;
  char *ca = NULL;
  int rc = read_pair(tls, "server", &pair);
  if (rc) return rc;
  if (tls->ca_file) rc = read_pem(tls->ca_file, "--tls-ca", "CERTIFICATE", &ca);
  if (rc == 0) {
    /* With a CA: mutual TLS, every client must present a certificate that the CA signed. */
    *out = grpc_ssl_server_credentials_create_ex(
        ca, &pair, 1,
        ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE, NULL);
    if (!*out) rc = dpc_err(DPC_EINVAL, "server TLS: gRPC refused the certificate/key/CA (%s, %s%s%s)",
                            tls->cert_file, tls->key_file, ca ? ", " : "", ca ? tls->ca_file : "");
  }
  free_pem(ca);
  free_pem((char *)pair.cert_chain);
  free_pem((char *)pair.private_key);
  return rc;
}

int rpc_creds_channel(const struct rpc_tls *tls, grpc_channel_credentials **out) {
  *out = NULL;
  if (!tls) {
    *out = grpc_insecure_credentials_create();
    return *out ? 0 : dpc_err(DPC_EINTERNAL, "rpc: cannot create channel credentials");
  }
  if (!tls->ca_file)
    return dpc_err(DPC_EINVAL, "client TLS needs --tls-ca (the CA that signed the server's certificate)");
  grpc_ssl_pem_key_cert_pair pair;
  char *ca = NULL;
  int rc = read_pem(tls->ca_file, "--tls-ca", "CERTIFICATE", &ca);
  if (rc == 0) rc = read_pair(tls, "client", &pair);
  if (rc == 0) {
    *out = grpc_ssl_credentials_create(ca, pair.cert_chain ? &pair : NULL, NULL, NULL);
    if (!*out) rc = dpc_err(DPC_EINVAL, "client TLS: gRPC refused the CA/certificate/key (%s)", tls->ca_file);
    free_pem((char *)pair.cert_chain);
    free_pem((char *)pair.private_key);
  }
  free_pem(ca);
  return rc;
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
