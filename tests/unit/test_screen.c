/* test_screen.c — the delta norm screen (coordinator/delta_screen.h): the median reference, the
 * bound k · median, the first delta of a fragment (no reference: passes), the ring keeping
 * only the last SCREEN_WINDOW norms, and the window reloaded from the store's recorded norms
 * (store_delta_norms) deciding like the one kept in memory. */
#include "coordinator/delta_screen.h"
#include "coordinator/store.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
  screen_window w;
  memset(&w, 0, sizeof w);
  double bound = 0;
  /* Empty window: nothing to compare with, everything passes (but not with k = 0 either). */
  CHECK(isnan(screen_reference(&w)));
  CHECK_EQ_INT(screen_reject(&w, 5, 1e30, &bound), 0);
  CHECK(isinf(bound));
  /* A non-finite norm is refused whenever the screen is on. */
  CHECK_EQ_INT(screen_reject(&w, 5, NAN, NULL), 1);
  CHECK_EQ_INT(screen_reject(&w, 0, NAN, NULL), 0);

  /* Median of an odd and an even count. */
  screen_add(&w, 3);
  CHECK_NEAR(screen_reference(&w), 3, 0);
  screen_add(&w, 1);
  CHECK_NEAR(screen_reference(&w), 2, 0);
  screen_add(&w, 100); /* one outlier does not move the median far */
  CHECK_NEAR(screen_reference(&w), 3, 0);
  screen_add(&w, NAN); /* ignored */
  screen_add(&w, -1);  /* ignored */
  CHECK_EQ_INT(w.n, 3);

  /* Bound k · median: k = 4, median 3 → 12. Equal passes, above is refused; k = 0 is off. */
  CHECK_EQ_INT(screen_reject(&w, 4, 12, &bound), 0);
  CHECK_NEAR(bound, 12, 1e-12);
  CHECK_EQ_INT(screen_reject(&w, 4, 12.0001, &bound), 1);
  CHECK_EQ_INT(screen_reject(&w, 4, 0.001, NULL), 0); /* small deltas (partial work) always pass */
  CHECK_EQ_INT(screen_reject(&w, 0, 1e30, &bound), 0);
  CHECK(isinf(bound));

  /* The ring keeps the last SCREEN_WINDOW norms: after SCREEN_WINDOW deltas of norm 10 the
   * early ones (1, 3, 100) are gone and the median is 10. */
  for (int i = 0; i < SCREEN_WINDOW; i++) screen_add(&w, 10);
  CHECK_EQ_INT(w.n, SCREEN_WINDOW);
  CHECK_NEAR(screen_reference(&w), 10, 0);
  /* A growing trend (norms rising as the LR warms up) moves the reference along. */
  for (int i = 0; i < SCREEN_WINDOW / 2 + 1; i++) screen_add(&w, 40);
  CHECK_NEAR(screen_reference(&w), 40, 0);
  CHECK_EQ_INT(screen_reject(&w, 3, 119, NULL), 0);
  CHECK_EQ_INT(screen_reject(&w, 3, 121, NULL), 1);

  /* A zero reference (all-zero deltas) screens nothing rather than refusing every delta. */
  screen_window z;
  memset(&z, 0, sizeof z);
  screen_add(&z, 0);
  CHECK_EQ_INT(screen_reject(&z, 10, 1, NULL), 0);

  /* The store keeps the norms it was given and hands back the last ones, oldest first. */
  char dir[] = "/tmp/dpc_screen_XXXXXX";
  if (!mkdtemp(dir)) {
    fprintf(stderr, "mkdtemp failed\n");
    return 1;
  }
  store *st = NULL;
  CHECK_EQ_INT(store_open(dir, &st), 0);
  if (st) {
    double v[SCREEN_WINDOW];
    int n = -1;
    CHECK_EQ_INT(store_delta_norms(st, 1, 0, SCREEN_WINDOW, v, &n), 0);
    CHECK_EQ_INT(n, 0);
    store_close(st);
  }
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  TEST_DONE();
}
