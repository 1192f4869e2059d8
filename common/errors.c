/* errors.c — error code table and the per-thread error detail string. */
#include "common/errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char err_detail[1024];

const char *dpc_strerror(int code) {
  switch (code) {
  case DPC_OK: return "ok";
#define DPC_X_CASE(name, c, msg) case c: return msg;
    DPC_ERRNO_MAP(DPC_X_CASE)
#undef DPC_X_CASE
  default: return "unknown error";
  }
}

/* Formats into a local buffer first: a caller that wraps the previous detail
 * (dpc_err(c, "...: %s", dpc_errmsg())) passes a pointer into err_detail itself, and
 * vsnprintf into the buffer it reads from is undefined (it garbled such messages). */
int dpc_err(int code, const char *fmt, ...) {
  char buf[sizeof err_detail];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  memcpy(err_detail, buf, sizeof buf);
  return code;
}

const char *dpc_errmsg(void) { return err_detail; }

void dpc_errclear(void) { err_detail[0] = '\0'; }
