/* view.h — how dipacoctl's admin commands show what the coordinator returns: enum values as
 * names, losses and times as short text, JSON strings and numbers, and a job (summary and
 * spec) as a text table or one JSON object. Everything writes to the FILE given (or stdout)
 * or into the caller's buffer; nothing is allocated for the caller.
 * Thread-safety: none needed (single-threaded CLI). */
#ifndef DPC_CTL_VIEW_H
#define DPC_CTL_VIEW_H

#include "proto/dipaco.pb-c.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* A JSON string literal (quoted, escaped; NULL as ""). */
void view_jstr(FILE *f, const char *s);
/* A float as JSON: non-finite values (NaN = "unknown" loss) become null. */
void view_jnum(FILE *f, double v);

/* A loss as "%.4f", "-" when unknown or 0; returns buf. */
const char *view_fmt_loss(double v, char *buf, size_t cap);
/* A Unix time in ms as ISO 8601 UTC, "-" when unset; returns buf. */
const char *view_fmt_time(int64_t unix_ms, char *buf, size_t cap);

const char *view_job_state_name(int s);      /* "RUNNING" */
int view_job_state_parse(const char *s);     /* "running" (any case) -> JobState, or -1 */
const char *view_algorithm_name(int a);      /* "sync", "async-delayed", "async-nesterov" */
const char *view_worker_state_name(int s);   /* "IDLE" */

/* The fields of a job summary inside a JSON object (no braces). */
void view_summary_fields(FILE *f, const Dipaco__V1__JobSummary *s);
/* j's summary, or an empty one when the server sent none. */
const Dipaco__V1__JobSummary *view_job_summary(const Dipaco__V1__Job *j);
/* One progress line for a terminal, drawn over the previous one ("\r", no newline):
 * "job ID STATE [#####.....] ROUND/TOTAL rounds (P%) loss L". */
void view_progress_bar(FILE *f, uint64_t id, const Dipaco__V1__JobSummary *s);
/* A job on stdout: one JSON object per line with json, else a text table of the summary and
 * the spec. */
void view_print_job(int json, const Dipaco__V1__Job *j);

#endif
