/* errors.c — error code table and the per-thread error detail string. */
#include "common/errors.h"

#include <stdarg.h>
#include <stdio.h>

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

int dpc_err(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_detail, sizeof err_detail, fmt, ap);
  va_end(ap);
  return code;
}

const char *dpc_errmsg(void) { return err_detail; }

void dpc_errclear(void) { err_detail[0] = '\0'; }
