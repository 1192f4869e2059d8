/* cpu_llmc.c — llm.c's CPU reference trainer (train_gpt2.c, included unchanged) as a peer of
 * tests/bench/cpu_train.sh: llm.c's own forward, backward and AdamW, driven on the same
 * checkpoint (cpu_llmc_ckpt.py converts dipaco's init), the same llm.c token shards and the
 * same batch order as `dipacoctl train` (batch s at token (s mod nb)*B*T, row j T further);
 * llm.c's train_gpt2.c main is left out (it hard-codes B, T and its data, and evaluates and
 * samples between steps). Its update is llm.c's: no clipping, weight decay 0, lr 1e-4.
 * Build: cc -Ofast -march=native -fopenmp -DOMP -DTESTING -I$LLMC_DIR cpu_llmc.c -lm
 * Usage: cpu_llmc CHECKPOINT B T WARMUP STEPS SHARD...   (threads: OMP_NUM_THREADS)
 * Prints one JSON line: tokens_per_s (timed steps), step0_loss, final_loss. */
#include "train_gpt2.c"

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: cpu_llmc CHECKPOINT B T WARMUP STEPS SHARD...\n");
    return 2;
  }
  const int B = atoi(argv[2]), T = atoi(argv[3]), warm = atoi(argv[4]), steps = atoi(argv[5]);
  if (B < 1 || T < 1 || warm < 0 || steps < 1) {
    fprintf(stderr, "cpu_llmc: B, T, STEPS must be >= 1 and WARMUP >= 0\n");
    return 2;
  }
  size_t ntok = 0, cap = 0;
  uint16_t *tok = NULL;
  for (int i = 6; i < argc; i++) {
    FILE *f = fopen(argv[i], "rb");
    int h[256];
    if (!f || fread(h, sizeof(int), 256, f) != 256 || h[0] != 20240520 || h[1] != 1 || h[2] < 0) {
      fprintf(stderr, "cpu_llmc: %s: not an llm.c token shard\n", argv[i]);
      return 1;
    }
    if (ntok + (size_t)h[2] > cap) {
      cap = 2 * (ntok + (size_t)h[2]);
      tok = realloc(tok, cap * sizeof *tok);
      if (!tok) return 1;
    }
    if (fread(tok + ntok, sizeof *tok, (size_t)h[2], f) != (size_t)h[2]) {
      fprintf(stderr, "cpu_llmc: %s: short shard\n", argv[i]);
      return 1;
    }
    ntok += (size_t)h[2];
    fclose(f);
  }
  const size_t bt = (size_t)B * T, nb = ntok > 0 ? (ntok - 1) / bt : 0;
  if (nb == 0) {
    fprintf(stderr, "cpu_llmc: %zu tokens are fewer than one batch\n", ntok);
    return 1;
  }
  GPT2 model;
  gpt2_build_from_checkpoint(&model, argv[1]);
  if (T > model.config.max_seq_len) {
    fprintf(stderr, "cpu_llmc: T %d exceeds the checkpoint's %d\n", T, model.config.max_seq_len);
    return 1;
  }
  for (size_t i = 0; i < ntok; i++)
    if (tok[i] >= model.config.vocab_size) {
      fprintf(stderr, "cpu_llmc: token %d outside the vocabulary %d\n", tok[i], model.config.vocab_size);
      return 1;
    }
  int *in = malloc(bt * sizeof(int)), *tg = malloc(bt * sizeof(int));
  if (!in || !tg) return 1;
  double t0 = 0.0;
  float step0 = 0.0f;
  for (int s = 0; s < warm + steps; s++) {
    if (s == warm) t0 = mono_s();
    const size_t o = ((size_t)s % nb) * bt;
    for (size_t i = 0; i < bt; i++) {
      in[i] = tok[o + i];
      tg[i] = tok[o + i + 1];
    }
    gpt2_forward(&model, in, tg, B, T);
    gpt2_zero_grad(&model);
    gpt2_backward(&model);
    gpt2_update(&model, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, s + 1);
    if (s == 0) step0 = model.mean_loss;
  }
  const double el = mono_s() - t0;
  printf("{\"tokens_per_s\":%.2f,\"step0_loss\":%.6f,\"final_loss\":%.6f}\n", steps * (double)bt / el, step0,
         model.mean_loss);
  gpt2_free(&model);
  free(in);
  free(tg);
  free(tok);
  return 0;
}
