/* selfcheck.c — the listener's self-check (contract in selfcheck.h). */
#include "coordinator/selfcheck.h"

#include "common/errors.h"
#include "common/log.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

typedef struct selfcheck {
  atomic_int stop;
  char host[256];   /* "" with unix set */
  char port[16];
  char unix_path[108];
  int unix_sock;
  int period_ms, max_fail;
} check_cfg;

void selfcheck_stop(struct selfcheck *k) {
  if (k) atomic_store(&k->stop, 1);
}

/* The HTTP/2 client preface and an empty SETTINGS frame. */
static const char PREFACE[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

static int ms_left(const struct timespec *until) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  long ms = (until->tv_sec - now.tv_sec) * 1000L + (until->tv_nsec - now.tv_nsec) / 1000000L;
  return ms < 0 ? 0 : (int)ms;
}

/* One probe within timeout_ms: 0 when the server accepted the connection, else -1 with a
 * reason in why. */
static int probe(const check_cfg *k, int timeout_ms, char *why, size_t cap) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += timeout_ms / 1000;
  until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  int fd = -1;
  if (k->unix_sock) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", k->unix_path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS)) {
      snprintf(why, cap, "connect unix:%s: %s", k->unix_path, strerror(errno));
      if (fd >= 0) close(fd);
      return -1;
    }
  } else {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
    int g = getaddrinfo(k->host, k->port, &hints, &ai);
    if (g != 0 || !ai) {
      snprintf(why, cap, "resolve %s: %s", k->host, gai_strerror(g));
      return -1;
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int e = fd < 0 ? errno : 0;
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) e = errno;
    freeaddrinfo(ai);
    if (e) {
      snprintf(why, cap, "connect %s:%s: %s", k->host, k->port, strerror(e));
      if (fd >= 0) close(fd);
      return -1;
    }
  }
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  if (poll(&p, 1, ms_left(&until)) <= 0) {
    snprintf(why, cap, "connect timed out after %d ms", timeout_ms);
    close(fd);
    return -1;
  }
  int soerr = 0;
  socklen_t sl = sizeof soerr;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
  if (soerr) {
    snprintf(why, cap, "connect: %s", strerror(soerr));
    close(fd);
    return -1;
  }
  /* The kernel completes the TCP handshake into the backlog on its own; only an answer
   * shows that the server took the connection. */
  if (send(fd, PREFACE, sizeof PREFACE - 1, MSG_NOSIGNAL) < 0) {
    close(fd);
    return 0; /* reset right away: something took it and refused it */
  }
  p = (struct pollfd){.fd = fd, .events = POLLIN};
  int r = poll(&p, 1, ms_left(&until));
  close(fd);
  if (r > 0) return 0; /* data, EOF or a reset: the server saw the connection */
  snprintf(why, cap, "no answer within %d ms (the listener is not accepting connections)", timeout_ms);
  return -1;
}

static void *check_main(void *arg) {
  check_cfg *k = arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  int fails = 0;
  char why[512];
  for (;;) {
    struct timespec ts = {k->period_ms / 1000, (long)(k->period_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    if (atomic_load(&k->stop)) break;
    int ok = probe(k, k->period_ms, why, sizeof why) == 0;
    if (atomic_load(&k->stop)) break;
    if (ok) {
      if (fails) DPC_INFO("self-check: the listener accepts connections again");
      fails = 0;
      continue;
    }
    fails++;
    DPC_WARN("self-check %d of %d failed: %s", fails, k->max_fail, why);
    if (fails >= k->max_fail) {
      DPC_ERROR("self-check: new connections have not been accepted for %d checks in a row (last: %s); exiting "
                "with status %d so that the service manager restarts the coordinator", fails, why, SELFCHECK_EXIT);
      _exit(SELFCHECK_EXIT);
    }
  }
  free(k);
  return NULL;
}

int selfcheck_start(const char *listen, int port, int period_ms, int max_fail, struct selfcheck **out) {
  *out = NULL;
  if (period_ms <= 0) return 0;
  check_cfg *k = calloc(1, sizeof *k);
  if (!k) return dpc_err(DPC_ENOMEM, "self-check: out of memory");
  k->period_ms = period_ms;
  k->max_fail = max_fail > 0 ? max_fail : 1;
  if (strncmp(listen, "unix:", 5) == 0) {
    k->unix_sock = 1;
    snprintf(k->unix_path, sizeof k->unix_path, "%s", listen + 5);
  } else {
    const char *colon = strrchr(listen, ':');
    size_t n = colon ? (size_t)(colon - listen) : strlen(listen);
    if (n >= sizeof k->host) n = sizeof k->host - 1;
    memcpy(k->host, listen, n);
    k->host[n] = '\0';
    if (k->host[0] == '[' && n >= 2 && k->host[n - 1] == ']') { /* [v6] */
      memmove(k->host, k->host + 1, n - 2);
      k->host[n - 2] = '\0';
    }
    if (!k->host[0] || strcmp(k->host, "0.0.0.0") == 0) snprintf(k->host, sizeof k->host, "127.0.0.1");
    else if (strcmp(k->host, "::") == 0) snprintf(k->host, sizeof k->host, "::1");
    snprintf(k->port, sizeof k->port, "%d", port);
  }
  pthread_t t;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&t, &at, check_main, k);
  pthread_attr_destroy(&at);
  if (rc != 0) {
    free(k);
    return dpc_err(DPC_EINTERNAL, "self-check: cannot start its thread");
  }
  *out = k;
  return 0;
}
