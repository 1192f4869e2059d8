# Llama-class leaf kernels (kernels/cpu/llama_kernels.h) against PyTorch: RMSNorm, RoPE with the
# llama3 scaling, SwiGLU and grouped-query attention, forward and backward (the oracle must run:
# torch missing is a failure).
add_executable(test_llama_kernels ${CMAKE_SOURCE_DIR}/tests/unit/test_llama_kernels.c)
target_link_libraries(test_llama_kernels PRIVATE dpc_kernels dpc_common)
dpc_test(NAME llama_kernels LABEL oracle TIMEOUT 60
         COMMAND test_llama_kernels ${CMAKE_SOURCE_DIR}/tests/oracle/llama_ops_oracle.py ${DPC_PYTHON})
