/* test_blobs_known.c — the set of inner-state names known to be in the store
 * (coordinator/blobs_known.h): it answers "ask the store" until it is complete; then holds
 * exactly the names added and not deleted, in any order of adds and deletes, through growth;
 * a reset empties it and makes it incomplete again. */
#include "coordinator/blobs_known.h"
#include "tests/unit/test.h"

#include <stdio.h>

int main(void) {
  blobs_known *k = blobs_known_new();
  CHECK(k != NULL);
  if (!k) TEST_DONE();
  CHECK_EQ_INT(blobs_known_add(k, "1/f0-v1-a1.innerm"), 0);
  CHECK_EQ_INT(blobs_known_has(k, "1/f0-v1-a1.innerm"), -1); /* not complete: ask the store */
  blobs_known_set_complete(k);
  CHECK_EQ_INT(blobs_known_has(k, "1/f0-v1-a1.innerm"), 1);
  CHECK_EQ_INT(blobs_known_has(k, "1/f0-v1-a2.innerm"), 0);

  /* 500 names added in a scrambled order (past the first growth), every third deleted. */
  char name[64];
  int in[500] = {0};
  for (int i = 0; i < 500; i++) {
    int j = (i * 137) % 500;
    snprintf(name, sizeof name, "2/f%d-v%d-a3.innerv", j % 7, j);
    CHECK_EQ_INT(blobs_known_add(k, name), 0);
    CHECK_EQ_INT(blobs_known_add(k, name), 0); /* twice: still once */
    in[j] = 1;
  }
  for (int j = 0; j < 500; j += 3) {
    snprintf(name, sizeof name, "2/f%d-v%d-a3.innerv", j % 7, j);
    blobs_known_del(k, name);
    in[j] = 0;
  }
  blobs_known_del(k, "2/never-added.innerv");
  int wrong = 0;
  for (int j = 0; j < 500; j++) {
    snprintf(name, sizeof name, "2/f%d-v%d-a3.innerv", j % 7, j);
    wrong += blobs_known_has(k, name) != in[j];
  }
  CHECK_EQ_INT(wrong, 0);
  snprintf(name, sizeof name, "2/f%d-v%d-a3.innerv", 0, 0);
  CHECK_EQ_INT(blobs_known_has(k, name), 0);
  CHECK_EQ_INT(blobs_known_has(k, "1/f0-v1-a1.innerm"), 1);

  blobs_known_reset(k);
  CHECK_EQ_INT(blobs_known_has(k, "1/f0-v1-a1.innerm"), -1);
  blobs_known_set_complete(k);
  CHECK_EQ_INT(blobs_known_has(k, "1/f0-v1-a1.innerm"), 0);
  blobs_known_free(k);
  TEST_DONE();
}
