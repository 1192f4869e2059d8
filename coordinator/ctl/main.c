/* ctl.c — dipacoctl's entry point: global flags, subcommand dispatch, usage text, and the
 * strict option parser every subcommand uses. */
#include "coordinator/ctl/ctl.h"
#include "common/errors.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: dipacoctl COMMAND [options]\n"
    "\n"
    "Offline tools (no coordinator needed):\n"
    "  data prepare --tokenizer byte|gpt2 [--vocab-dir DIR] --out DIR [--val-fraction F] FILE|DIR...\n"
    "  init --n-layer L --n-head NH --n-embd C --n-positions T --vocab-size V [--seed S] --out DIR\n"
    "  train --model DIR --data SHARD... --out DIR --steps N --batch B --seq-len T\n"
    "        [--lr X --warmup N --lr-min-frac F --weight-decay X --beta1 X --beta2 X --eps X\n"
    "         --grad-clip X --threads N --json]\n"
    "  eval --model DIR --data SHARD... --batch B --seq-len T [--batches K --threads N --json]\n"
    "  generate --model DIR --tokenizer byte|gpt2 [--vocab-dir DIR] --prompt TEXT --tokens N\n"
    "        [--temperature X --top-k K --seed S --threads N]\n"
    "  (train, eval, generate: --backend cpu|cuda [--precision fp32|tf32|bf16 --device N] for\n"
    "   the GPU; fp32 is the exact default)\n"
    "\n"
    "Admin commands (talk to a coordinator: --coordinator ADDR or $DIPACO_COORDINATOR, default\n"
    "127.0.0.1:7070; the admin token from --token-file FILE or $DIPACO_ADMIN_TOKEN is sent as a\n"
    "bearer token; --tls-ca FILE [--tls-cert FILE --tls-key FILE] for (mutual) TLS; --json prints\n"
    "one JSON document):\n"
    "  job create SPEC.json [--paused]   uploads \"model\": {\"init\": DIR}; prints the job id\n"
    "  job list [--state S] | job show ID | job pause|resume|cancel ID [--reason TEXT]\n"
    "  job wait ID [--timeout S --poll-ms N]   exit 0 DONE, 1 FAILED/CANCELLED, 3 timeout\n"
    "  job export ID --path P --out DIR [--version V]\n"
    "  job ledger ID                     async jobs: applied deltas in order, with staleness\n"
    "  workers [--all --job ID] | paths ID | modules ID | status\n"
    "\n"
    "Run 'dipacoctl COMMAND --help' for a command's options.\n";

static int parse_number(const char *cmd, const ctl_opt *o, const char *v) {
  char *end = NULL;
  errno = 0;
  switch (o->kind) {
  case CTL_INT:
  case CTL_LONG: {
    long long x = strtoll(v, &end, 10);
    if (errno || !*v || *end || (o->kind == CTL_INT && (x < INT_MIN || x > INT_MAX))) break;
    if (o->kind == CTL_INT) *(int *)o->dst = (int)x;
    else *(long *)o->dst = (long)x;
    return 0;
  }
  case CTL_FLOAT: {
    float x = strtof(v, &end);
    if (errno || !*v || *end || !isfinite(x)) break;
    *(float *)o->dst = x;
    return 0;
  }
  default: break;
  }
  fprintf(stderr, "dipacoctl %s: --%s expects %s, got '%s'\n", cmd, o->name,
          o->kind == CTL_FLOAT ? "a finite number" : "an integer", v);
  return 2;
}

int ctl_parse(const char *cmd, int argc, char **argv, ctl_opt *opts, char ***pos, int *npos) {
  char **p = calloc((size_t)argc + 1, sizeof *p);
  int np = 0;
  if (!p) return 1;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      while (++i < argc) p[np++] = argv[i];
      break;
    }
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
      p[np++] = argv[i];
      continue;
    }
    if (strcmp(a, "--help") == 0) {
      fputs(usage_text, stdout);
      free(p);
      return -1;
    }
    const char *name = a + 2, *val = NULL;
    size_t nlen = strlen(name);
    const char *eq = strchr(name, '=');
    if (eq) {
      nlen = (size_t)(eq - name);
      val = eq + 1;
    }
    ctl_opt *o = NULL;
    for (ctl_opt *q = opts; q->name; q++)
      if (strlen(q->name) == nlen && strncmp(q->name, name, nlen) == 0) o = q;
    if (!o) {
      fprintf(stderr, "dipacoctl %s: unknown flag '%s' (see 'dipacoctl %s --help')\n", cmd, a, cmd);
      free(p);
      return 2;
    }
    o->seen = 1;
    if (o->kind == CTL_FLAG) {
      if (val) {
        fprintf(stderr, "dipacoctl %s: --%s takes no value\n", cmd, o->name);
        free(p);
        return 2;
      }
      *(int *)o->dst = 1;
      continue;
    }
    if (!val) {
      if (i + 1 >= argc) {
        fprintf(stderr, "dipacoctl %s: --%s needs a value\n", cmd, o->name);
        free(p);
        return 2;
      }
      val = argv[++i];
    }
    if (o->kind == CTL_STR) {
      *(const char **)o->dst = val;
    } else if (parse_number(cmd, o, val)) {
      free(p);
      return 2;
    }
  }
  for (ctl_opt *q = opts; q->name; q++) {
    if (q->required && !q->seen) {
      fprintf(stderr, "dipacoctl %s: missing required flag --%s\n", cmd, q->name);
      free(p);
      return 2;
    }
  }
  *pos = p;
  *npos = np;
  return 0;
}

/* Connection flags of the admin commands, accepted before the command too. */
static int is_conn_flag(const char *a) {
  return !strcmp(a, "--token-file") || !strcmp(a, "--tls-ca") || !strcmp(a, "--tls-cert") || !strcmp(a, "--tls-key");
}

int main(int argc, char **argv) {
  const char *coordinator = getenv("DIPACO_COORDINATOR");
  char *conn[8];
  int n_conn = 0;
  int i = 1;
  while (i < argc && strncmp(argv[i], "--", 2) == 0) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_text, stdout);
      return 0;
    } else if (strcmp(argv[i], "--coordinator") == 0 && i + 1 < argc) {
      coordinator = argv[i + 1];
      i += 2;
    } else if (strncmp(argv[i], "--coordinator=", 14) == 0) {
      coordinator = argv[i] + 14;
      i += 1;
    } else if (is_conn_flag(argv[i]) && i + 1 < argc && n_conn + 2 <= (int)(sizeof conn / sizeof conn[0])) {
      conn[n_conn++] = argv[i];
      conn[n_conn++] = argv[i + 1];
      i += 2;
    } else {
      break; /* global flags end; admin flags like --json are parsed by the command */
    }
  }
  if (i >= argc) {
    fputs(usage_text, stderr);
    return 2;
  }
  const char *cmd = argv[i];
  int rest = argc - i - 1;
  char **rargv = argv + i + 1;
  if (strcmp(cmd, "data") == 0) {
    if (rest >= 1 && strcmp(rargv[0], "prepare") == 0) return ctl_data_prepare(rest - 1, rargv + 1);
    fprintf(stderr, "dipacoctl data: unknown subcommand (use 'data prepare')\n");
    return 2;
  }
  struct { const char *name; int (*fn)(int, char **); } offline[] = {
      {"init", ctl_init}, {"train", ctl_train}, {"eval", ctl_eval}, {"generate", ctl_generate}};
  for (size_t k = 0; k < sizeof offline / sizeof offline[0]; k++)
    if (strcmp(cmd, offline[k].name) == 0) return offline[k].fn(rest, rargv);
  if (strcmp(cmd, "help") == 0) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (n_conn == 0) return ctl_admin(coordinator, argc - i, argv + i);
  /* Connection flags given before the command go right after its words ("job SUB"). */
  int nw = strcmp(cmd, "job") == 0 && rest >= 1 ? 2 : 1, n = argc - i;
  char **av = calloc((size_t)(n + n_conn + 1), sizeof *av);
  if (!av) return 1;
  memcpy(av, argv + i, (size_t)nw * sizeof *av);
  memcpy(av + nw, conn, (size_t)n_conn * sizeof *av);
  memcpy(av + nw + n_conn, argv + i + nw, (size_t)(n - nw) * sizeof *av);
  int st = ctl_admin(coordinator, n + n_conn, av);
  free(av);
  return st;
}
