/* delta_screen.h — the delta norm screen (job spec "outer.delta_norm_screen" = k).
 *
 * A delta whose L2 norm is more than k times the reference norm of its fragment is refused
 * before it is stored (a corrupt, diverged or hostile worker's delta must never reach the
 * outer step). The reference is the median of the L2 norms of the last SCREEN_WINDOW deltas
 * of the fragment that were accepted (recorded), across rounds: a running reference, so the
 * first delta of a round is screened against the rounds before it, and diloco-async (where a
 * "round" is one applied delta) works the same way. With no accepted norm yet — the first
 * delta of a fragment — there is nothing to compare with and the delta passes. Only norms
 * above the bound are refused: a partial delta (fewer inner steps, e.g. a preempted async
 * worker or a DyLU slow worker) is smaller, never screened out. k = 0 turns the screen off.
 *
 * The window is in memory (coord_job); after a coordinator restart it is reloaded from the
 * norms recorded with the deltas in the store (deltas.norm), so the screen decides the same
 * way whether or not the coordinator restarted.
 *
 * Ownership: a screen_window is a plain value. Thread-safety: none (the loop thread owns it). */
#ifndef DPC_DELTA_SCREEN_H
#define DPC_DELTA_SCREEN_H

#include <stddef.h>

#define SCREEN_WINDOW 32

typedef struct screen_window_s {
  double v[SCREEN_WINDOW]; /* ring of accepted norms */
  int n;                   /* entries in use, ≤ SCREEN_WINDOW */
  int head;                /* next slot to overwrite */
  int loaded;              /* filled from the store since the coordinator started */
} screen_window;

/* Add one accepted norm (ignored unless finite and >= 0). */
void screen_add(screen_window *w, double norm);

/* The median of the window (mean of the two middle values for an even count); NaN if empty. */
double screen_reference(const screen_window *w);

/* 1 if norm must be refused under factor k (k > 0, the reference is positive and
 * norm > k · reference; or k > 0 and norm is not finite), else 0. *bound (may be NULL) is k · reference,
 * or +Inf when nothing is screened. */
int screen_reject(const screen_window *w, double k, double norm, double *bound);

/* The AdamW bound, always on: no honest delta of `steps` AdamW steps over n
 * parameters is larger. Per step AdamW moves a parameter by lr·(|m̂/(√v̂+ε)| + wd·|θ|), and
 * |m̂/√v̂| ≤ 1/√(1−β2); with a factor 10 of margin and |θ| ≤ 100, the delta's L2 norm is at most
 * steps·lr·(10/√(1−β2) + 100·wd)·√n. A SparseLoCo stream sends part of an error-feedback buffer
 * that sums up to 1/(1−ef_beta) deltas (ef_beta 0 otherwise). A poisoned delta (3.4e38
 * everywhere, a diverged worker) is far above it; a partial delta is below it. */
double screen_adamw_bound(double lr, double beta2, double weight_decay, double ef_beta, long long steps, size_t n);

#endif
