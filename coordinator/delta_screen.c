/* delta_screen.c — the delta norm screen: a ring of recent accepted norms and its median (see
 * delta_screen.h). */
#include "coordinator/delta_screen.h"

#include <math.h>
#include <stdlib.h>

void screen_add(screen_window *w, double norm) {
  if (!isfinite(norm) || norm < 0) return;
  w->v[w->head] = norm;
  w->head = (w->head + 1) % SCREEN_WINDOW;
  if (w->n < SCREEN_WINDOW) w->n++;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double screen_reference(const screen_window *w) {
  if (w->n <= 0) return NAN;
  double s[SCREEN_WINDOW];
  for (int i = 0; i < w->n; i++) s[i] = w->v[i];
  qsort(s, (size_t)w->n, sizeof s[0], cmp_double);
  return w->n % 2 ? s[w->n / 2] : 0.5 * (s[w->n / 2 - 1] + s[w->n / 2]);
}

int screen_reject(const screen_window *w, double k, double norm, double *bound) {
  if (bound) *bound = INFINITY;
  if (!(k > 0)) return 0;
  if (!isfinite(norm)) return 1;
  double ref = screen_reference(w);
  if (!(ref > 0) || !isfinite(ref)) return 0; /* nothing to compare with (or all-zero deltas) */
  double b = k * ref;
  if (bound) *bound = b;
  return norm > b;
}

double screen_adamw_bound(double lr, double beta2, double weight_decay, double ef_beta, long long steps, size_t n) {
  double per_step = lr * (10.0 / sqrt(1.0 - beta2) + 100.0 * weight_decay);
  return (double)(steps > 0 ? steps : 1) * per_step * sqrt((double)n) / (1.0 - ef_beta);
}
