/* log.c — leveled text or JSON-lines logging to stderr. */
#include "common/log.h"
#include "common/errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static const char *log_component = "dipaco";
static int log_json = 0;
static enum dpc_log_level log_min = DPC_LOG_INFO;
static const char *level_names[] = {"debug", "info", "warn", "error"};

void dpc_log_init(const char *component, int json, enum dpc_log_level min_level) {
  log_component = component ? component : "dipaco";
  log_json = json < 0 ? !isatty(STDERR_FILENO) : json;
  log_min = min_level;
}

int dpc_log_parse_level(const char *s, enum dpc_log_level *out) {
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(s, level_names[i]) == 0) {
      *out = (enum dpc_log_level)i;
      return 0;
    }
  }
  return dpc_err(DPC_EINVAL, "unknown log level '%s' (use debug, info, warn or error)", s);
}

/* Appends `s` to `out` as a JSON string body (no quotes), escaping what JSON requires. */
static size_t json_escape(char *out, size_t cap, const char *s) {
  size_t n = 0;
  for (; *s && n + 7 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      out[n++] = '\\';
      out[n++] = (char)c;
    } else if (c < 0x20) {
      n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
    } else {
      out[n++] = (char)c;
    }
  }
  out[n] = '\0';
  return n;
}

void dpc_log(enum dpc_log_level level, const char *fmt, ...) {
  if (level < log_min) return;
  char msg[2048], line[8448], ts[96];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  struct tm tm;
  gmtime_r(&now.tv_sec, &tm);
  snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
           tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)(now.tv_nsec / 1000000) % 1000);
  int n;
  if (log_json) {
    char esc[4200];
    json_escape(esc, sizeof esc, msg);
    n = snprintf(line, sizeof line, "{\"ts\":\"%s\",\"level\":\"%s\",\"component\":\"%s\",\"msg\":\"%s\"}\n",
                 ts, level_names[level], log_component, esc);
  } else {
    n = snprintf(line, sizeof line, "%s %-5s %s: %s\n", ts, level_names[level], log_component, msg);
  }
  if (n < 0) return;
  if ((size_t)n >= sizeof line) n = (int)sizeof line - 1;
  ssize_t w = write(STDERR_FILENO, line, (size_t)n);
  (void)w;
}
