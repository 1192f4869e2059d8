/* jobspec_doc.c — prints docs/jobspec.md as the field table (coordinator/jobspec_fields.c)
 * gives it, to stdout or to the file named by the one argument. The target jobspec-doc writes
 * the checked-in file with it; the test jobspec_doc compares that file with its output
 * (tests/cmake/jobspec_doc.cmake). */
#include "common/errors.h"
#include "coordinator/jobspec_doc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc > 2) {
    fprintf(stderr, "usage: jobspec_doc [OUTPUT_FILE]\n");
    return 2;
  }
  char *md = NULL;
  if (jobspec_doc_markdown(&md)) {
    fprintf(stderr, "jobspec_doc: %s\n", dpc_errmsg());
    return 1;
  }
  FILE *f = argc == 2 ? fopen(argv[1], "w") : stdout;
  if (!f) {
    perror(argv[1]);
    free(md);
    return 1;
  }
  int ok = fwrite(md, 1, strlen(md), f) == strlen(md);
  ok = (argc == 2 ? fclose(f) : fflush(f)) == 0 && ok;
  free(md);
  if (!ok) fprintf(stderr, "jobspec_doc: write failed\n");
  return ok ? 0 : 1;
}
