/* cpu_llama.h — the CPU backend's Llama family (cpu_llama.c), called by cpu_backend.c's
 * vtable when the model's arch is llama (docs/design.md §3.12). */
#ifndef DPC_CPU_LLAMA_H
#define DPC_CPU_LLAMA_H

#include "kernels/cpu/cpu_shared.h"
#include "kernels/gpt.h"

/* Activations for the Llama family at create (sets c->logits, c->losses, c->lse and c->lnf into
 * its own block, and the RoPE tables); DPC_ENOMEM / DPC_EINVAL. The caller destroys on error. */
int cpu_llama_create(gpt_model *m, cpu_impl *c);
/* Frees what cpu_llama_create allocated (nothing for GPT-2). */
void cpu_llama_destroy(cpu_impl *c);
/* The passes; arguments already checked by gpt.c and cpu_backend.c. */
int cpu_llama_forward(gpt_model *m, const int *inputs, const int *targets, int B, int T, float *loss);
int cpu_llama_backward(gpt_model *m);

#endif
