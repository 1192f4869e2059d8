/* ctl.c — what every dipacoctl command shares, offline and admin alike: the usage text,
 * the flag parsing step (common/args.h with the command's name, --help printing the usage)
 * and the monotonic clock. It calls no command, so neither half depends on the other. */
#include "coordinator/ctl/ctl.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const char usage_text[] =
    "usage: dipacoctl COMMAND [options]\n"
    "\n"
    "Offline tools (no coordinator needed):\n"
    "  data prepare --tokenizer byte|gpt2|PATH/tokenizer.json [--vocab-dir DIR] --out DIR [--val-fraction F] FILE|DIR...\n"
    "  init --n-layer L --n-head NH --n-embd C --n-positions T --vocab-size V [--seed S] --out DIR\n"
    "       [--arch gpt2|llama; llama: --n-kv-head N --intermediate-size I --rms-norm-eps X\n"
    "        --rope-theta X --untied --attention-bias --rope-scaling llama3 [--rope-factor X\n"
    "        --rope-low-freq-factor X --rope-high-freq-factor X --rope-original-max-positions N]]\n"
    "  train --model DIR --data SHARD... --out DIR --steps N --batch B --seq-len T\n"
    "        [--lr X --warmup N --lr-min-frac F --weight-decay X --beta1 X --beta2 X --eps X\n"
    "         --grad-clip X --threads N --json --opt-state-out FILE]\n"
    "        [--optimizer adamw|muon --muon-lr X --muon-momentum X --muon-nesterov 0|1\n"
    "         --muon-ns-steps N --muon-weight-decay X --muon-adjust-lr original|match_rms_adamw]\n"
    "  eval --model DIR --data SHARD... --batch B --seq-len T [--batches K --threads N --json]\n"
    "  generate --model DIR | --dipaco DIR [--reroute-every W] --tokenizer byte|gpt2|PATH/tokenizer.json [--vocab-dir DIR]\n"
    "        --prompt TEXT --tokens N\n"
    "        [--temperature X --top-k K --seed S --threads N]\n"
    "  route fit --model BASE --data SHARD... --seq-len T (--k K | --grid K1xK2) [--prefix 32]\n"
    "        [--seed S --max-iters N] --out ROUTER_DIR     DiPaCo router: k-means on prefix features\n"
    "  route fit --discriminative --dipaco DIR --data SHARD... --seq-len T [--sequences K --iters N\n"
    "        --lr X --l2 X] --out ROUTER_DIR   linear router on each sequence's lowest-loss path\n"
    "  route assign --router DIR --data SHARD... --seq-len T [--top 1|2] --out DIR\n"
    "        per-path shards DIR/path_<p>/train_000.bin; prints the job spec's data.paths\n"
    "  eval --dipaco DIR --data SHARD... --seq-len T [--batch B --reroute-every W --sequences K --json]\n"
    "        routed eval of a DiPaCo model directory (job export --all-paths --router R)\n"
    "  (train, eval, generate: --backend cpu|cuda [--precision fp32|tf32|bf16 --device N] for\n"
    "   the GPU; fp32 is the exact default)\n"
    "\n"
    "Admin commands (talk to a coordinator: --coordinator ADDR or $DIPACO_COORDINATOR, default\n"
    "127.0.0.1:7070; the admin token from --token-file FILE or $DIPACO_ADMIN_TOKEN is sent as a\n"
    "bearer token; --tls-ca FILE [--tls-cert FILE --tls-key FILE] for (mutual) TLS; --json prints\n"
    "one JSON document):\n"
    "  job create SPEC.json [--paused]   uploads \"model\": {\"init\": DIR}; prints the job id\n"
    "        [--data-dir DIR]             check every path's data under DIR first (as a worker)\n"
    "  job list [--state S] | job show ID | job pause|resume|cancel ID [--reason TEXT]\n"
    "  job wait ID [--timeout S --poll-ms N]   exit 0 DONE, 1 FAILED/CANCELLED, 3 timeout\n"
    "        (a progress bar on a terminal)\n"
    "  job watch ID [--timeout S --poll-ms N]  live view (round, loss trend, tokens/s, bytes, ETA,\n"
    "        workers) until the job ends; plain lines when stdout is not a terminal\n"
    "  job plot ID --out FILE.svg          loss per path against inner steps and bytes exchanged\n"
    "  job export ID --path P --out DIR [--version V]\n"
    "  job export ID --all-paths --out DIR [--router ROUTER_DIR --version V]   DiPaCo model directory\n"
    "  job ledger ID [--json]            applied deltas in order with staleness, and a summary\n"
    "  workers [--all --job ID] | paths ID [--data-dir DIR] | modules ID | status\n"
    "\n"
    "Run 'dipacoctl COMMAND --help' for a command's options.\n";

void ctl_usage(FILE *f) { fputs(usage_text, f); }

int ctl_args(const char *cmd, int argc, char **argv, dpc_arg *args, char ***pos, int *npos, int *status) {
  char prog[64];
  snprintf(prog, sizeof prog, "dipacoctl %s", cmd);
  char **p = NULL;
  if (pos && !(p = calloc((size_t)argc + 1, sizeof *p))) {
    *status = 1;
    return 1;
  }
  int np = 0, rc = dpc_args_parse(prog, argc, argv, args, p, &np);
  if (rc == 0) {
    if (pos) *pos = p;
    if (npos) *npos = np;
    return 0;
  }
  free(p);
  if (rc == 1) ctl_usage(stdout);
  *status = rc == 1 ? 0 : 2;
  return 1;
}
