/* log.h — leveled logging to stderr for daemons and tools.
 *
 * Two formats: human text ("2026-11-22T04:10:00Z INFO worker: message") for a terminal and
 * one JSON object per line for log collectors (journald, container runtimes). The format and
 * level are process-wide settings made once at start-up by main(); logging itself is
 * thread-safe (one write(2) per line). */
#ifndef DPC_LOG_H
#define DPC_LOG_H

enum dpc_log_level { DPC_LOG_DEBUG = 0, DPC_LOG_INFO, DPC_LOG_WARN, DPC_LOG_ERROR };

/* component: short name shown on each line ("coordinator", "worker"); json: 1 for JSON lines,
 * 0 for text, -1 to pick JSON when stderr is not a terminal. */
void dpc_log_init(const char *component, int json, enum dpc_log_level min_level);

/* Parse "debug|info|warn|error"; returns 0 and sets *out, or DPC_EINVAL. */
int dpc_log_parse_level(const char *s, enum dpc_log_level *out);

void dpc_log(enum dpc_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DPC_DEBUG(...) dpc_log(DPC_LOG_DEBUG, __VA_ARGS__)
#define DPC_INFO(...) dpc_log(DPC_LOG_INFO, __VA_ARGS__)
#define DPC_WARN(...) dpc_log(DPC_LOG_WARN, __VA_ARGS__)
#define DPC_ERROR(...) dpc_log(DPC_LOG_ERROR, __VA_ARGS__)

#endif
