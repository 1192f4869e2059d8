/* blobs_known.c — the set of inner-state names known to be in the store (contract in
 * blobs_known.h). */
#include "coordinator/blobs_known.h"

#include "common/errors.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct blobs_known {
  pthread_mutex_t mu;
  char **v; /* sorted by strcmp */
  int n, cap;
  int complete;
};

blobs_known *blobs_known_new(void) {
  blobs_known *k = calloc(1, sizeof *k);
  if (k) pthread_mutex_init(&k->mu, NULL);
  return k;
}

static void clear(blobs_known *k) {
  for (int i = 0; i < k->n; i++) free(k->v[i]);
  k->n = 0;
}

void blobs_known_free(blobs_known *k) {
  if (!k) return;
  clear(k);
  free(k->v);
  pthread_mutex_destroy(&k->mu);
  free(k);
}

/* Under the lock: the index of name, or -(insertion point) - 1. */
static int find(const blobs_known *k, const char *name) {
  int lo = 0, hi = k->n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2, c = strcmp(k->v[mid], name);
    if (c == 0) return mid;
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -lo - 1;
}

int blobs_known_add(blobs_known *k, const char *name) {
  int rc = 0;
  pthread_mutex_lock(&k->mu);
  int i = find(k, name);
  if (i < 0) {
    i = -i - 1;
    char *s = NULL;
    if (k->n == k->cap) {
      int cap = k->cap ? 2 * k->cap : 64;
      char **v = realloc(k->v, (size_t)cap * sizeof *v);
      if (v) {
        k->v = v;
        k->cap = cap;
      }
    }
    if (k->n < k->cap && (s = strdup(name))) {
      memmove(k->v + i + 1, k->v + i, (size_t)(k->n - i) * sizeof *k->v);
      k->v[i] = s;
      k->n++;
    } else {
      rc = DPC_ENOMEM;
    }
  }
  pthread_mutex_unlock(&k->mu);
  return rc;
}

void blobs_known_del(blobs_known *k, const char *name) {
  pthread_mutex_lock(&k->mu);
  int i = find(k, name);
  if (i >= 0) {
    free(k->v[i]);
    memmove(k->v + i, k->v + i + 1, (size_t)(k->n - i - 1) * sizeof *k->v);
    k->n--;
  }
  pthread_mutex_unlock(&k->mu);
}

int blobs_known_has(blobs_known *k, const char *name) {
  pthread_mutex_lock(&k->mu);
  int r = !k->complete ? -1 : find(k, name) >= 0;
  pthread_mutex_unlock(&k->mu);
  return r;
}

void blobs_known_reset(blobs_known *k) {
  pthread_mutex_lock(&k->mu);
  clear(k);
  k->complete = 0;
  pthread_mutex_unlock(&k->mu);
}

void blobs_known_set_complete(blobs_known *k) {
  pthread_mutex_lock(&k->mu);
  k->complete = 1;
  pthread_mutex_unlock(&k->mu);
}
