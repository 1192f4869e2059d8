# Llama-class leaf kernels (kernels/cpu/llama_kernels.h) against PyTorch: RMSNorm, RoPE with the
# llama3 scaling, SwiGLU and grouped-query attention, forward and backward (the oracle must run:
# torch missing is a failure).
add_executable(test_llama_kernels ${CMAKE_SOURCE_DIR}/tests/unit/test_llama_kernels.c)
target_link_libraries(test_llama_kernels PRIVATE dpc_kernels dpc_common)
dpc_test(NAME llama_kernels LABEL oracle TIMEOUT 60
         COMMAND test_llama_kernels ${CMAKE_SOURCE_DIR}/tests/oracle/llama_ops_oracle.py ${DPC_PYTHON})

# The Llama family in the training core: the CPU backend's whole model (forward, backward, five
# clipped AdamW steps, a bit-identical replay) against a PyTorch LlamaForCausalLM written from
# HF's definitions (tests/oracle/llama_oracle.py; torch missing is a failure).
add_executable(test_llama_oracle ${CMAKE_SOURCE_DIR}/tests/unit/test_llama_oracle.c)
target_link_libraries(test_llama_oracle PRIVATE dpc_kernels dpc_common)
dpc_test(NAME llama_oracle LABEL oracle TIMEOUT 120
         COMMAND test_llama_oracle ${CMAKE_SOURCE_DIR}/tests/oracle/llama_oracle.py ${DPC_PYTHON})

# Its layout, config checks and init.
add_executable(test_llama_layout ${CMAKE_SOURCE_DIR}/tests/unit/test_llama_layout.c)
target_link_libraries(test_llama_layout PRIVATE dpc_kernels dpc_common)
dpc_test(NAME llama_layout LABEL unit TIMEOUT 60 COMMAND test_llama_layout)

# Hugging Face Llama/Qwen2 model directories in and out: BF16 shards with an index, F16, tied and
# untied, and every refusal naming its key, file or tensor.
add_executable(test_llama_modeldir ${CMAKE_SOURCE_DIR}/tests/unit/test_llama_modeldir.c)
target_link_libraries(test_llama_modeldir PRIVATE dpc_kernels dpc_common)
dpc_test(NAME llama_modeldir LABEL unit TIMEOUT 60 COMMAND test_llama_modeldir)

# dipacoctl init --arch llama, train, eval and generate end to end; the export loads strictly into
# the PyTorch module of tests/oracle/llama_oracle.py and agrees with eval's loss
# (tests/integration/ctl_llama.sh).
dpc_test(NAME ctl_llama LABEL integration TIMEOUT 300
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/ctl_llama.sh $<TARGET_FILE:dipacoctl> ${DPC_PYTHON})
