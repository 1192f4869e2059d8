/* wan_delay.c — a two-port Ethernet relay that delays every frame by a fixed time, for
 * tests/bench/wan.sh on kernels without sch_netem (CONFIG_NET_SCH_NETEM unset, as on the
 * bench machine: `tc qdisc add ... netem` answers "Specified qdisc kind is unknown").
 *
 * usage: wan_delay IF_A IF_B DELAY_MS
 *
 * Run inside a network namespace that holds IF_A and IF_B (two veth ends with no address):
 * every frame that arrives on one is sent out of the other DELAY_MS later, in order, like a
 * wire with that one-way latency (a bridge with a delay line). One thread per direction.
 * AF_PACKET sockets with PACKET_VNET_HDR carry GSO super-frames and partial checksums through
 * unchanged (as a tap device does for a VM), so TCP segmentation offload stays on and the
 * relay moves few, large frames. Rate limits are not its business: wan.sh puts an HTB on the
 * egress of both endpoints' veths. A frame that finds the delay line full (QCAP frames) is
 * dropped, as a full router queue would. Stops on SIGTERM/SIGINT. Not part of CI. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define FRAME_MAX (10 + 65536 + 64) /* virtio_net_hdr + the largest GSO frame */
#define QCAP 65536

typedef struct {
  uint64_t due_ns;
  size_t len;
  unsigned char *buf;
} item;

typedef struct {
  int in, out;
  const char *name;
  uint64_t delay_ns;
  item *q;
  size_t head, n;
  unsigned long long frames, bytes, dropped;
} dir;

static volatile sig_atomic_t stop;
static void on_sig(int s) { (void)s; stop = 1; }

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int open_if(const char *ifname) {
  int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
  if (fd < 0) return perror("socket(AF_PACKET)"), -1;
  int one = 1, big = 32 << 20;
  if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0) return perror("PACKET_VNET_HDR"), -1;
#ifdef PACKET_IGNORE_OUTGOING
  if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) < 0) perror("PACKET_IGNORE_OUTGOING");
#endif
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big) < 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big) < 0) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  struct sockaddr_ll sa = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = (int)if_nametoindex(ifname)};
  if (!sa.sll_ifindex) return fprintf(stderr, "wan_delay: no interface %s\n", ifname), -1;
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) return perror("bind"), -1;
  struct packet_mreq mr = {.mr_ifindex = sa.sll_ifindex, .mr_type = PACKET_MR_PROMISC};
  if (setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof mr) < 0) return perror("PACKET_MR_PROMISC"), -1;
  return fd;
}

static void *run(void *arg) {
  dir *d = arg;
  unsigned char *rx = malloc(FRAME_MAX);
  d->q = calloc(QCAP, sizeof *d->q);
  if (!rx || !d->q) return perror("malloc"), NULL;
  while (!stop) {
    uint64_t t = now_ns();
    /* Send everything that is due. */
    while (d->n && d->q[d->head].due_ns <= t) {
      item *it = &d->q[d->head];
      if (send(d->out, it->buf, it->len, 0) < 0 && errno != ENOBUFS && errno != EAGAIN)
        fprintf(stderr, "wan_delay %s: send: %s\n", d->name, strerror(errno));
      free(it->buf);
      d->head = (d->head + 1) % QCAP;
      d->n--;
    }
    /* Wait for a frame or the next due time (at most 100 ms, to notice `stop`). */
    uint64_t wait = 100000000ull;
    if (d->n && d->q[d->head].due_ns - t < wait) wait = d->q[d->head].due_ns - t;
    struct pollfd p = {.fd = d->in, .events = POLLIN};
    struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
    if (ppoll(&p, 1, &ts, NULL) <= 0) continue;
    for (int k = 0; k < 256; k++) {
      ssize_t n = recv(d->in, rx, FRAME_MAX, MSG_DONTWAIT);
      if (n <= 0) break;
      if (d->n == QCAP) {
        d->dropped++;
        continue;
      }
      item *it = &d->q[(d->head + d->n) % QCAP];
      it->buf = malloc((size_t)n);
      if (!it->buf) {
        d->dropped++;
        continue;
      }
      memcpy(it->buf, rx, (size_t)n);
      it->len = (size_t)n;
      it->due_ns = now_ns() + d->delay_ns;
      d->n++;
      d->frames++;
      d->bytes += (unsigned long long)n;
    }
  }
  free(rx);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: wan_delay IF_A IF_B DELAY_MS\n");
    return 2;
  }
  double ms = atof(argv[3]);
  if (!(ms >= 0 && ms < 60000)) return fprintf(stderr, "wan_delay: bad DELAY_MS %s\n", argv[3]), 2;
  int a = open_if(argv[1]), b = open_if(argv[2]);
  if (a < 0 || b < 0) return 1;
  struct sigaction sa = {.sa_handler = on_sig};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  uint64_t delay = (uint64_t)(ms * 1e6);
  dir ab = {.in = a, .out = b, .name = "a->b", .delay_ns = delay};
  dir ba = {.in = b, .out = a, .name = "b->a", .delay_ns = delay};
  pthread_t t1, t2;
  pthread_create(&t1, NULL, run, &ab);
  pthread_create(&t2, NULL, run, &ba);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  fprintf(stderr, "wan_delay %s<->%s: %llu/%llu frames, %llu/%llu bytes, %llu/%llu dropped\n", argv[1], argv[2],
          ab.frames, ba.frames, ab.bytes, ba.bytes, ab.dropped, ba.dropped);
  return 0;
}
