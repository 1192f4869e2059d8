/* rpc.h — the thin gRPC call layer shared by the coordinator, the worker and dipacoctl.
 *
 * It wraps the gRPC C core (Debian libgrpc 1.51) and protobuf-c:
 *
 *  - messages: pack/unpack protobuf-c messages to/from gRPC byte buffers, with a size bound;
 *  - chunks: the dipaco.v1.Chunk message encoded and decoded by hand so that tensor bytes are
 *    copied once, straight between the wire and the destination buffer (rpc_chunk.c);
 *  - server: registered methods (unary, server-streaming, client-streaming) with per-method
 *    callbacks, a pump thread on the completion queue, grpc.health.v1.Health/Check served by
 *    the layer, UNIMPLEMENTED for everything else, and the clean shutdown sequence
 *    (rpc_server.c);
 *  - client: a channel with blocking unary calls, server-streaming reads, client-streaming
 *    writes, per-client metadata (worker id + session token) and status → DPC_E* mapping
 *    (rpc_client.c);
 *  - credentials are created in one place (rpc_msg.c: insecure, TLS or mutual TLS).
 *
 * Threading. Server: every callback of a server runs on ONE thread, its dispatch thread, and
 * the rpc_call_* functions must only be called on that thread. With `notify` NULL the
 * dispatch thread is the layer's pump thread (handlers must not block). With `notify` set,
 * the pump thread queues completions and calls notify(notify_ud) (e.g. uv_async_send); the
 * owner then calls rpc_server_dispatch() on its own thread (e.g. the libuv loop), which runs
 * the callbacks there. Client: an rpc_client may be used from several threads at once; one
 * rpc_stream belongs to one thread at a time. Errors: functions return 0 or a negative DPC_E*
 * code and leave a detail in dpc_errmsg(); client calls also record the gRPC status code of
 * the thread's last call (rpc_last_code()). */
#ifndef DPC_RPC_H
#define DPC_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

struct grpc_byte_buffer; /* one message on the wire; see rpc_msg_* */

/* gRPC status codes (values fixed by the gRPC protocol). */
enum rpc_code {
  RPC_OK = 0,
  RPC_CANCELLED = 1,
  RPC_UNKNOWN = 2,
  RPC_INVALID_ARGUMENT = 3,
  RPC_DEADLINE_EXCEEDED = 4,
  RPC_NOT_FOUND = 5,
  RPC_ALREADY_EXISTS = 6,
  RPC_PERMISSION_DENIED = 7,
  RPC_RESOURCE_EXHAUSTED = 8,
  RPC_FAILED_PRECONDITION = 9,
  RPC_ABORTED = 10,
  RPC_OUT_OF_RANGE = 11,
  RPC_UNIMPLEMENTED = 12,
  RPC_INTERNAL = 13,
  RPC_UNAVAILABLE = 14,
  RPC_DATA_LOSS = 15,
  RPC_UNAUTHENTICATED = 16,
};

/* Largest message either peer accepts (both directions) unless configured otherwise. */
#define RPC_MAX_MSG_DEFAULT (8u << 20)
/* Default chunk payload: 4 MiB − 1 KiB, which fits gRPC's default 4 MiB receive limit with
 * the chunk header, so that outside clients (grpcio defaults) can pull without tuning. */
#define RPC_CHUNK_DEFAULT ((4u << 20) - 1024u)
#define RPC_CHUNK_MIN (64u << 10)
/* Worker identity metadata on Coordinator calls (proto/dipaco.proto header comment). */
#define RPC_MD_WORKER_ID "dipaco-worker-id"
#define RPC_MD_SESSION "dipaco-session"
#define RPC_MD_AUTHORIZATION "authorization"

/* Map a gRPC status code to a DPC_E* code (RPC_OK → 0) and back; names for messages. */
int rpc_code_to_dpc(int code);
int rpc_code_from_dpc(int dpc_rc);
const char *rpc_code_name(int code);

/* TLS settings: PEM file paths (a config pointer of NULL means plain text). Server: cert_file
 * + key_file required; with ca_file, clients must present a certificate signed by that CA
 * (mutual TLS). Client: ca_file required (the server's certificate is verified against it and
 * against the target host name or IP); cert_file + key_file, both or neither, present a client
 * certificate (mutual TLS). Files are read when the server starts / the channel opens; an
 * unreadable file or one without the expected PEM block fails there with DPC_E* and a message
 * that names the flag and path. */
struct rpc_tls {
  const char *ca_file, *cert_file, *key_file;
};

/* Process-wide malloc tuning for bulk transfers: keeps multi-MB chunk buffers in the heap
 * instead of mmap/munmap + trim churn, which otherwise makes page faults dominate (measured
 * here: 0.2–0.4 GB/s without, 1.3–1.8 GB/s with, 256 MiB over loopback).
 * Call once from main() of a process that moves tensors (coordinator, worker, CLI export)
 * before other threads start. */
void rpc_tune_malloc(void);

/* ---------------------------------------------------------------------------------------
 * Messages.
 * ------------------------------------------------------------------------------------- */

/* Pack a protobuf-c message into a new byte buffer. Returns NULL on out-of-memory. The
 * caller owns the result (rpc_msg_free, or hand it to rpc_call_send / rpc_stream_write). */
struct grpc_byte_buffer *rpc_msg_pack(const ProtobufCMessage *m);

/* Unpack `m` as `desc`, refusing messages over max_bytes (0 = RPC_MAX_MSG_DEFAULT). On
 * success *out is owned by the caller: free with protobuf_c_message_free_unpacked(*out,
 * NULL). DPC_EFORMAT for malformed bytes, DPC_ERANGE for too large. Only the wire format is
 * checked: field values are the caller's to validate. */
int rpc_msg_unpack(const struct grpc_byte_buffer *m, const ProtobufCMessageDescriptor *desc,
                   size_t max_bytes, ProtobufCMessage **out);

size_t rpc_msg_len(const struct grpc_byte_buffer *m);
/* A second handle on a received message that shares its bytes (slice references, no copy),
 * so that another thread may read it after the callback returned; free it with rpc_msg_free
 * (any thread). NULL on out-of-memory. */
struct grpc_byte_buffer *rpc_msg_ref(const struct grpc_byte_buffer *m);
void rpc_msg_free(struct grpc_byte_buffer *m);

/* ---------------------------------------------------------------------------------------
 * Chunks (dipaco.v1.Chunk, hand-coded; field meanings in proto/dipaco.proto).
 * ------------------------------------------------------------------------------------- */

struct rpc_chunk {
  uint64_t lease_id, fragment_id, version;
  uint64_t offset;      /* byte offset of the data in the encoded stream */
  uint64_t total;       /* byte length of the whole stream */
  uint32_t codec;       /* dipaco.v1.Codec */
  uint32_t crc32c;      /* CRC-32C of the whole stream; on the last chunk */
  uint64_t num_floats;
  uint32_t block_floats;
  uint64_t inner_steps, tokens;
  uint32_t payload;     /* dipaco.v1.Payload */
  uint64_t step;
  uint64_t len;         /* bytes of data in this chunk */
  uint64_t data_pos;    /* set by rpc_chunk_parse: where the data starts in the message */
};

/* Parse the header fields of a received Chunk without copying its data. Fields may come in
 * any order; unknown fields are skipped. Checks: well-formed wire format, a single data
 * field, offset + len ≤ total without overflow, codec/payload enums in range. */
int rpc_chunk_parse(const struct grpc_byte_buffer *m, struct rpc_chunk *c);

/* Copy the data of a parsed chunk (c->len bytes) to dst. */
int rpc_chunk_copy(const struct grpc_byte_buffer *m, const struct rpc_chunk *c, void *dst);

/* Encode a chunk whose data is `c->len` bytes at `data`. With release == NULL the data is
 * copied. Otherwise it is referenced, zero-copy: the caller keeps `data` unchanged and
 * alive until gRPC calls release(release_ud) (from any thread, once per encoded chunk, at
 * the latest when the call carrying it has ended). Returns NULL on out-of-memory. */
struct grpc_byte_buffer *rpc_chunk_encode(const struct rpc_chunk *c, const void *data,
                                          void (*release)(void *ud), void *release_ud);

/* ---------------------------------------------------------------------------------------
 * Server.
 * ------------------------------------------------------------------------------------- */

struct rpc_server;
struct rpc_call;

enum rpc_kind { RPC_UNARY, RPC_SERVER_STREAM, RPC_CLIENT_STREAM };

/* One served method. Callbacks run on the server's dispatch thread; byte buffers passed to
 * them are owned by the layer and valid only during the callback. */
struct rpc_method {
  const char *path; /* "/dipaco.v1.Coordinator/Lease" */
  enum rpc_kind kind;
  /* A new call. Unary and server-streaming: `req` is the request message (never NULL).
   * Client-streaming: `req` is NULL and messages follow through on_message. The handler
   * answers now or later (rpc_call_reply / rpc_call_send / rpc_call_finish). Required. */
  void (*on_call)(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud);
  /* Client-streaming: the next message, or NULL when the client closed its side (answer
   * then). Return 0 to go on reading, 1 to pause until rpc_call_read(). */
  int (*on_message)(struct rpc_call *call, const struct grpc_byte_buffer *msg, void *ud);
  /* Server-streaming: the last rpc_call_send() completed; ok = 0 means the call is dead
   * (stop sending; on_done follows). Optional. */
  void (*on_sent)(struct rpc_call *call, int ok, void *ud);
  /* The call is over (status sent, or cancelled: client cancel, deadline, shutdown); the
   * call pointer is invalid once this returns. cancelled = 1 if the status did not reach
   * the client. Optional. */
  void (*on_done)(struct rpc_call *call, int cancelled, void *ud);
  void *ud;
};

struct rpc_server_config {
  const char *addr;       /* "0.0.0.0:7070"; port 0 picks a free port (rpc_server_port) */
  size_t max_msg_bytes;   /* send and receive limit, 0 = RPC_MAX_MSG_DEFAULT */
  int armed;              /* requests kept armed per method, 0 = 4 */
  void (*notify)(void *ud); /* NULL: callbacks run on the pump thread; see header comment */
  void *notify_ud;
  const struct rpc_tls *tls; /* NULL = insecure */
  /* Connection limits (0 = the defaults below): a connection that has not completed its
   * TLS and HTTP/2 handshakes (the client's SETTINGS frame) within handshake_timeout_ms is
   * closed, so is one without calls for idle_timeout_ms (GOAWAY; clients reconnect on their
   * next call), and one connection carries at most max_streams calls at once (more wait in
   * the client). Keepalive: the server pings a silent connection every 60 s and drops it
   * when no answer comes within 20 s (dead peers, half-open sockets); a client pinging more
   * often than every 10 s without data is sent GOAWAY after 2 strikes. */
  int handshake_timeout_ms, idle_timeout_ms, max_streams;
};
#define RPC_HANDSHAKE_TIMEOUT_DEFAULT_MS 10000
#define RPC_IDLE_TIMEOUT_DEFAULT_MS 300000
#define RPC_MAX_STREAMS_DEFAULT 100

/* Create, bind and start a server with n methods (copied; `path` strings too). The
 * services named by the method paths and "" report SERVING to Health/Check. Calls grpc_init
 * (balanced by rpc_server_stop). Block SIGTERM/SIGINT in the calling thread before this so
 * that gRPC's threads inherit the mask (a signal must never land on one of them). */
int rpc_server_start(const struct rpc_server_config *cfg, const struct rpc_method *methods,
                     size_t n, struct rpc_server **out);

/* The bound TCP port. */
int rpc_server_port(const struct rpc_server *s);

/* With `notify`: run the callbacks of every queued completion on this thread; returns how
 * many were handled. Without `notify`: does nothing and returns 0. */
int rpc_server_dispatch(struct rpc_server *s);

/* Set what Health/Check answers for `service` ("" = the server as a whole): serving = 1
 * SERVING, 0 NOT_SERVING, -1 forget it (then NOT_FOUND). Thread-safe. */
int rpc_server_set_health(struct rpc_server *s, const char *service, int serving);

/* Shut down and free: refuse new calls, let calls in flight finish for up to grace_ms, then
 * cancel the rest (their on_done runs with cancelled = 1), drain the queue, destroy.
 * Call it on the dispatch thread when `notify` is set (it dispatches while it waits), or on
 * any thread but the pump thread otherwise. s may be NULL. */
void rpc_server_stop(struct rpc_server *s, int grace_ms);

/* --- call functions: dispatch thread only; `c` is valid until its on_done returns. --- */

void rpc_call_set_data(struct rpc_call *c, void *data);
void *rpc_call_data(const struct rpc_call *c);
const char *rpc_call_method(const struct rpc_call *c);

/* Copy the first value of request metadata `key` (lower case) to buf as a NUL-terminated
 * string; returns its length, DPC_ENOENT if absent, DPC_ERANGE if it does not fit or holds
 * a NUL byte. */
int rpc_call_md(const struct rpc_call *c, const char *key, char *buf, size_t cap);

/* Milliseconds until the client's deadline (INT64_MAX if none; ≤ 0 if passed). */
int64_t rpc_call_deadline_ms(const struct rpc_call *c);

/* 1 once the call is known to be cancelled (the client will not see a reply). */
int rpc_call_cancelled(const struct rpc_call *c);

/* Unary and client-streaming: send `resp` with status OK. */
int rpc_call_reply(struct rpc_call *c, const ProtobufCMessage *resp);

/* Server-streaming: send one message; takes ownership of m (freed even on error). One send
 * at a time: wait for on_sent before the next (DPC_ESTATE otherwise). */
int rpc_call_send(struct rpc_call *c, struct grpc_byte_buffer *m);
int rpc_call_send_msg(struct rpc_call *c, const ProtobufCMessage *m);

/* End the call with a status (RPC_OK ends a server stream). If a send is in flight the
 * status follows it. The message is printf-style and shown to the client. */
int rpc_call_finish(struct rpc_call *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* End the call with the status that matches a DPC_E* code and dpc_errmsg() as message. */
int rpc_call_fail(struct rpc_call *c, int dpc_rc);

/* Client-streaming: resume reading after on_message returned 1. */
int rpc_call_read(struct rpc_call *c);

/* ---------------------------------------------------------------------------------------
 * Client.
 * ------------------------------------------------------------------------------------- */

struct rpc_client;
struct rpc_stream;

struct rpc_client_config {
  const char *target;     /* "host:port" */
  size_t max_msg_bytes;   /* 0 = RPC_MAX_MSG_DEFAULT */
  int own_connection;     /* 1: a TCP connection not shared with other channels */
  const struct rpc_tls *tls; /* NULL = insecure */
  /* Connection limits (0 = the defaults below): a connection that has not completed its
   * TLS and HTTP/2 handshakes (the client's SETTINGS frame) within handshake_timeout_ms is
   * closed, so is one without calls for idle_timeout_ms (GOAWAY; clients reconnect on their
   * next call), and one connection carries at most max_streams calls at once (more wait in
   * the client). Keepalive: the server pings a silent connection every 60 s and drops it
   * when no answer comes within 20 s (dead peers, half-open sockets); a client pinging more
   * often than every 10 s without data is sent GOAWAY after 2 strikes. */
  int handshake_timeout_ms, idle_timeout_ms, max_streams;
};
#define RPC_HANDSHAKE_TIMEOUT_DEFAULT_MS 10000
#define RPC_IDLE_TIMEOUT_DEFAULT_MS 300000
#define RPC_MAX_STREAMS_DEFAULT 100

/* Open a channel (connects lazily; calls wait for the connection until their deadline).
 * Calls grpc_init (balanced by rpc_client_close). */
int rpc_client_open(const struct rpc_client_config *cfg, struct rpc_client **out);
void rpc_client_close(struct rpc_client *c);

/* Metadata sent with every later call (e.g. RPC_MD_WORKER_ID, RPC_MD_SESSION); value NULL
 * removes the key. Keys are lower case. Not safe while calls are running on other threads. */
int rpc_client_set_md(struct rpc_client *c, const char *key, const char *value);

/* The gRPC status code of this thread's last client call (RPC_OK after success). */
int rpc_last_code(void);

/* Blocking unary call. On success *resp is the unpacked reply, owned by the caller
 * (protobuf_c_message_free_unpacked). timeout_ms ≤ 0 means no deadline. Errors map the
 * status with rpc_code_to_dpc (e.g. DEADLINE_EXCEEDED → DPC_ETIMEDOUT, UNAVAILABLE →
 * DPC_EUNAVAILABLE) and dpc_errmsg() holds "method: CODE: server message". */
int rpc_unary(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
              const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
              int timeout_ms);

/* rpc_unary that the caller can abandon: stop(ud) is polled every 50 ms while the call waits
 * (e.g. a long-polled Lease), and once it returns non-zero the call is cancelled
 * (grpc_call_cancel) and ends with DPC_ECANCELED / RPC_CANCELLED. stop may be NULL. */
int rpc_unary_stoppable(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
                        const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp, int timeout_ms,
                        int (*stop)(void *ud), void *ud);

/* Open a streaming call. Server-streaming: pass the request (it is sent and the client side
 * closed). Client-streaming: pass req = NULL, then rpc_stream_write and rpc_stream_finish. */
int rpc_stream_open(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
                    int timeout_ms, struct rpc_stream **out);

/* Server-streaming: next message. Returns 1 with *msg (caller frees with rpc_msg_free),
 * 0 at the end of a successful stream, or a negative code with the call's status. */
int rpc_stream_read(struct rpc_stream *s, struct grpc_byte_buffer **msg);

/* Client-streaming: send one message (ownership taken, freed even on error); blocks until
 * gRPC accepted it (flow control). */
int rpc_stream_write(struct rpc_stream *s, struct grpc_byte_buffer *msg);

/* Client-streaming: write one whole stream of `len` bytes as chunks of at most chunk_bytes
 * (0 = RPC_CHUNK_DEFAULT), header fields from `hdr` (offset, total, len and crc32c are set
 * here; the CRC-32C of data goes on the last chunk). Zero-copy: `data` must stay unchanged
 * until rpc_stream_finish/rpc_stream_free returns. len = 0 sends one empty chunk. */
int rpc_stream_write_chunks(struct rpc_stream *s, const struct rpc_chunk *hdr,
                            const void *data, size_t len, size_t chunk_bytes);

/* Client-streaming: close the client side, receive the reply and status. *resp as in
 * rpc_unary. Server-streaming streams may call it with resp_desc NULL to read the status
 * after the last message. */
int rpc_stream_finish(struct rpc_stream *s, const ProtobufCMessageDescriptor *resp_desc,
                      ProtobufCMessage **resp);

/* Cancel the call (the server sees CANCELLED); later reads/writes fail with DPC_ECANCELED. */
void rpc_stream_cancel(struct rpc_stream *s);

/* Free the stream, cancelling the call if it has not ended. s may be NULL. */
void rpc_stream_free(struct rpc_stream *s);

/* Pull one chunked stream (e.g. PullFragment) into dst[0, cap). The request asks for bytes
 * from `start` (resume); chunks must be contiguous from there, agree on total/fragment/
 * version, and total ≤ cap. The data of each chunk is copied straight into dst + offset.
 * At the end the CRC-32C of dst[0, total) is checked against the last chunk's (so after a
 * resume dst must still hold the earlier bytes). *got (optional) is the end of the
 * contiguous bytes received, also on error: resume from there. *hdr (optional) receives the
 * last chunk's header. DPC_ECHECKSUM on mismatch, DPC_EFORMAT on a malformed stream. */
int rpc_pull(struct rpc_client *c, const char *method, const ProtobufCMessage *req,
             int timeout_ms, uint64_t start, void *dst, size_t cap, struct rpc_chunk *hdr,
             size_t *got);

/* Push one buffer as a client-streaming call (e.g. PushDelta with one fragment):
 * rpc_stream_open + rpc_stream_write_chunks + rpc_stream_finish. */
int rpc_push(struct rpc_client *c, const char *method, const struct rpc_chunk *hdr,
             const void *data, size_t len, size_t chunk_bytes, int timeout_ms,
             const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp);

#endif
