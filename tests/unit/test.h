/* test.h — a minimal check macro set for the C unit tests: each failed check prints the
 * file, line and expression, and the test exits non-zero at the end. TEST_DONE() also fails a
 * test that made no check at all: a test that checked nothing did not test anything. */
#ifndef DPC_TEST_H
#define DPC_TEST_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int test_failures = 0;
static int test_checks = 0;

#define CHECK(cond)                                                                  \
  do {                                                                               \
    test_checks++;                                                                   \
    if (!(cond)) {                                                                   \
      test_failures++;                                                               \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
    }                                                                                \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                           \
  do {                                                                               \
    long long _a = (long long)(a), _b = (long long)(b);                              \
    test_checks++;                                                                   \
    if (_a != _b) {                                                                  \
      test_failures++;                                                               \
      fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, __LINE__, #a, _a, #b, _b); \
    }                                                                                \
  } while (0)

#define CHECK_NEAR(a, b, tol)                                                        \
  do {                                                                               \
    double _a = (double)(a), _b = (double)(b);                                       \
    test_checks++;                                                                   \
    if (!(fabs(_a - _b) <= (tol))) {                                                 \
      test_failures++;                                                               \
      fprintf(stderr, "%s:%d: %s = %.9g, expected %.9g (tol %g)\n", __FILE__, __LINE__, #a, _a, _b, (double)(tol)); \
    }                                                                                \
  } while (0)

#define TEST_DONE()                                                                  \
  do {                                                                               \
    fprintf(stderr, "%d checks, %d failed\n", test_checks, test_failures);           \
    if (test_checks == 0) fprintf(stderr, "FAIL: no checks ran\n");                 \
    return test_failures || test_checks == 0 ? 1 : 0;                               \
  } while (0)

#endif
