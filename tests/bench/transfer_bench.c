/* transfer_bench.c — loopback transfer throughput of the gRPC call layer vs raw TCP.
 *
 * In one process: a server (common/rpc_server.c) that serves a fragment as server-streaming
 * Chunk messages (zero-copy slices over the blob, CRC-32C precomputed as the coordinator
 * keeps it with the blob) and receives client-streaming pushes (chunk data copied straight
 * into a preallocated buffer, CRC-32C verified at the end); a client that pulls the
 * fragment with rpc_pull (CRC verified) and pushes it back with rpc_push (CRC computed).
 * The raw baseline sends the same bytes over a plain loopback TCP socket from one thread to
 * another (no framing, no checksum). Prints GB/s (1e9 bytes/s) for each, best of N runs.
 *
 * usage: transfer_bench [MiB=256] [runs=3] [nomallopt] */
#include "common/checksum.h"
#include "common/errors.h"
#include "common/rpc.h"
#include "proto/dipaco.pb-c.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint8_t *g_blob, *g_sink;
static size_t g_len;
static uint32_t g_crc;
static size_t g_chunk;
static volatile int g_push_bad;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void no_release(void *ud) { (void)ud; }

struct pull_st {
  uint64_t off;
  size_t chunk;
};

static void pull_next(struct rpc_call *c) {
  struct pull_st *st = rpc_call_data(c);
  size_t n = g_len - st->off < st->chunk ? g_len - st->off : st->chunk;
  struct rpc_chunk h = {.fragment_id = 1, .version = 1, .offset = st->off, .total = g_len,
                        .num_floats = g_len / 4, .len = n};
  int last = st->off + n == g_len;
  if (last) h.crc32c = g_crc;
  rpc_call_send(c, rpc_chunk_encode(&h, g_blob + st->off, no_release, NULL));
  st->off += n;
  if (last) rpc_call_finish(c, RPC_OK, NULL);
}

static void pull_call(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  ProtobufCMessage *pm;
  if (rpc_msg_unpack(req, &dipaco__v1__pull_fragment_request__descriptor, 1024, &pm)) {
    rpc_call_fail(c, DPC_EFORMAT);
    return;
  }
  Dipaco__V1__PullFragmentRequest *r = (void *)pm;
  struct pull_st *st = calloc(1, sizeof *st);
  st->off = r->offset <= g_len ? r->offset : g_len;
  st->chunk = r->max_chunk_bytes ? r->max_chunk_bytes : RPC_CHUNK_DEFAULT;
  protobuf_c_message_free_unpacked(pm, NULL);
  rpc_call_set_data(c, st);
  pull_next(c);
}

static void pull_sent(struct rpc_call *c, int ok, void *ud) {
  (void)ud;
  if (ok) pull_next(c);
}

static void free_data(struct rpc_call *c, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  free(rpc_call_data(c));
}

struct push_st {
  uint64_t expect, total;
  uint32_t crc;
};

static void push_call(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)req;
  (void)ud;
  rpc_call_set_data(c, calloc(1, sizeof(struct push_st)));
}

static int push_msg(struct rpc_call *c, const struct grpc_byte_buffer *m, void *ud) {
  (void)ud;
  struct push_st *st = rpc_call_data(c);
  if (!m) {
    if (st->expect != g_len || dpc_crc32c(0, g_sink, g_len) != st->crc) {
      g_push_bad = 1;
      rpc_call_finish(c, RPC_DATA_LOSS, "bad push");
      return 0;
    }
    Dipaco__V1__PushDeltaResponse r = DIPACO__V1__PUSH_DELTA_RESPONSE__INIT;
    rpc_call_reply(c, &r.base);
    return 0;
  }
  struct rpc_chunk ch;
  if (rpc_chunk_parse(m, &ch) || ch.total != g_len || ch.offset != st->expect) {
    rpc_call_finish(c, RPC_INVALID_ARGUMENT, "bad chunk");
    return 0;
  }
  rpc_chunk_copy(m, &ch, g_sink + ch.offset);
  st->expect += ch.len;
  if (st->expect == g_len) st->crc = ch.crc32c;
  return 0;
}

static void heartbeat(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  ProtobufCMessage *pm;
  if (rpc_msg_unpack(req, &dipaco__v1__heartbeat_request__descriptor, 1024, &pm)) {
    rpc_call_fail(c, DPC_EFORMAT);
    return;
  }
  protobuf_c_message_free_unpacked(pm, NULL);
  Dipaco__V1__HeartbeatResponse r = DIPACO__V1__HEARTBEAT_RESPONSE__INIT;
  r.lease_expires_unix_ms = 1;
  rpc_call_reply(c, &r.base);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* ---- raw TCP ---- */

struct raw_rx {
  int lfd;
  uint8_t *dst;
  size_t len;
  double t_end;
};

static void *raw_rx_main(void *arg) {
  struct raw_rx *r = arg;
  int fd = accept(r->lfd, NULL, NULL);
  size_t got = 0;
  while (got < r->len) {
    ssize_t k = recv(fd, r->dst + got, r->len - got, 0);
    if (k <= 0) break;
    got += (size_t)k;
  }
  r->t_end = now_s();
  close(fd);
  return NULL;
}

static double raw_tcp_once(void) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 1) ||
      getsockname(lfd, (struct sockaddr *)&a, &al)) {
    perror("raw tcp");
    exit(1);
  }
  struct raw_rx r = {.lfd = lfd, .dst = g_sink, .len = g_len};
  pthread_t th;
  pthread_create(&th, NULL, raw_rx_main, &r);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    perror("connect");
    exit(1);
  }
  double t0 = now_s();
  size_t sent = 0;
  while (sent < g_len) {
    ssize_t k = send(fd, g_blob + sent, g_len - sent, 0);
    if (k <= 0) break;
    sent += (size_t)k;
  }
  close(fd);
  pthread_join(th, NULL);
  close(lfd);
  if (memcmp(g_sink, g_blob, g_len) != 0) {
    fprintf(stderr, "raw tcp: data mismatch\n");
    exit(1);
  }
  return (double)g_len / (r.t_end - t0) / 1e9;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 256;
  int runs = argc > 2 ? atoi(argv[2]) : 3;
  int use_mallopt = !(argc > 3 && strcmp(argv[3], "nomallopt") == 0);
  if (mib == 0 || mib > 4096 || runs < 1) {
    fprintf(stderr, "usage: transfer_bench [MiB 1..4096] [runs] [nomallopt]\n");
    return 2;
  }
  if (use_mallopt) rpc_tune_malloc(); /* keep multi-MB buffers in the heap */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  g_len = mib << 20;
  g_blob = malloc(g_len);
  g_sink = malloc(g_len);
  uint8_t *dst = malloc(g_len);
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < g_len; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(g_blob + i, &x, 8);
  }
  memset(g_sink, 0, g_len);
  memset(dst, 0, g_len);
  g_crc = dpc_crc32c(0, g_blob, g_len);

  struct rpc_method methods[] = {
      {.path = "/dipaco.v1.Coordinator/PullFragment", .kind = RPC_SERVER_STREAM,
       .on_call = pull_call, .on_sent = pull_sent, .on_done = free_data},
      {.path = "/dipaco.v1.Coordinator/PushDelta", .kind = RPC_CLIENT_STREAM,
       .on_call = push_call, .on_message = push_msg, .on_done = free_data},
      {.path = "/dipaco.v1.Coordinator/Heartbeat", .kind = RPC_UNARY, .on_call = heartbeat},
  };
  struct rpc_server_config cfg = {.addr = "127.0.0.1:0"};
  struct rpc_server *srv;
  if (rpc_server_start(&cfg, methods, 3, &srv)) {
    fprintf(stderr, "server: %s\n", dpc_errmsg());
    return 1;
  }
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", rpc_server_port(srv));
  struct rpc_client *cli;
  struct rpc_client_config cc = {.target = addr};
  if (rpc_client_open(&cc, &cli)) {
    fprintf(stderr, "client: %s\n", dpc_errmsg());
    return 1;
  }

  printf("transfer: %zu MiB over loopback, best of %d runs%s\n", mib, runs,
         use_mallopt ? "" : " (no mallopt)");
  double raw = 0;
  for (int r = 0; r < runs; r++) {
    double g = raw_tcp_once();
    if (g > raw) raw = g;
  }
  printf("raw_tcp            %6.2f GB/s\n", raw);
  size_t chunks[2] = {(size_t)1 << 20, RPC_CHUNK_DEFAULT};
  int fails = 0;
  double best_pull_default = 0, best_push_default = 0;
  for (int k = 0; k < 2; k++) {
    g_chunk = chunks[k];
    double bp = 0, bq = 0;
    for (int r = 0; r < runs; r++) {
      Dipaco__V1__PullFragmentRequest req = DIPACO__V1__PULL_FRAGMENT_REQUEST__INIT;
      req.fragment_id = 1;
      req.max_chunk_bytes = (uint32_t)g_chunk;
      struct rpc_chunk hdr;
      double t0 = now_s();
      int rc = rpc_pull(cli, "/dipaco.v1.Coordinator/PullFragment", &req.base, 120000, 0, dst,
                        g_len, &hdr, NULL);
      double t1 = now_s();
      if (rc || memcmp(dst, g_blob, g_len) != 0) {
        fprintf(stderr, "pull failed: %s\n", rc ? dpc_errmsg() : "data mismatch");
        fails++;
      }
      double gbs = (double)g_len / (t1 - t0) / 1e9;
      if (gbs > bp) bp = gbs;
      struct rpc_chunk ph = {.fragment_id = 1, .version = 1,
                             .payload = DIPACO__V1__PAYLOAD__PAYLOAD_DELTA};
      ProtobufCMessage *resp;
      t0 = now_s();
      rc = rpc_push(cli, "/dipaco.v1.Coordinator/PushDelta", &ph, dst, g_len, g_chunk, 120000,
                    &dipaco__v1__push_delta_response__descriptor, &resp);
      t1 = now_s();
      if (rc || g_push_bad) {
        fprintf(stderr, "push failed: %s\n", dpc_errmsg());
        fails++;
      } else {
        protobuf_c_message_free_unpacked(resp, NULL);
      }
      gbs = (double)g_len / (t1 - t0) / 1e9;
      if (gbs > bq) bq = gbs;
    }
    printf("grpc_pull chunk=%-7zu %6.2f GB/s  (%.2f of raw)\n", g_chunk, bp, bp / raw);
    printf("grpc_push chunk=%-7zu %6.2f GB/s  (%.2f of raw)\n", g_chunk, bq, bq / raw);
    if (k == 1) {
      best_pull_default = bp;
      best_push_default = bq;
    }
  }
  double worst = best_pull_default < best_push_default ? best_pull_default : best_push_default;
  printf("goals (default chunk): >= 0.5 of raw TCP: %s (%.2f); >= 2 GB/s: %s (%.2f)\n",
         worst >= 0.5 * raw ? "met" : "NOT met", worst / raw, worst >= 2.0 ? "met" : "NOT met",
         worst);
  enum { NCALLS = 2000 };
  static double lat[NCALLS];
  for (int i = 0; i < NCALLS; i++) {
    Dipaco__V1__HeartbeatRequest hb = DIPACO__V1__HEARTBEAT_REQUEST__INIT;
    hb.lease_id = 42;
    hb.step = (uint64_t)i;
    ProtobufCMessage *resp;
    double t0 = now_s();
    int rc = rpc_unary(cli, "/dipaco.v1.Coordinator/Heartbeat", &hb.base,
                       &dipaco__v1__heartbeat_response__descriptor, &resp, 5000);
    lat[i] = (now_s() - t0) * 1e3;
    if (rc) {
      fprintf(stderr, "heartbeat: %s\n", dpc_errmsg());
      fails++;
      break;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  qsort(lat, NCALLS, sizeof lat[0], cmp_double);
  printf("unary heartbeat, sequential: median %.3f ms, p99 %.3f ms\n", lat[NCALLS / 2],
         lat[NCALLS * 99 / 100]);
  rpc_client_close(cli);
  rpc_server_stop(srv, 1000);
  free(g_blob);
  free(g_sink);
  free(dst);
  return fails ? 1 : 0;
}
