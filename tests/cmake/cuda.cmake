# Tests of the CUDA backend (kernels/cuda), built whenever it is (DIPACO_CUDA AUTO/ON with
# nvcc): each kernel against its CPU twin (GPT-2's in test_cuda_kernels, the Llama-class
# layers' in test_cuda_llama), the whole model against the CPU backend in fp32, tf32 and bf16,
# and the PyTorch oracle (torch on the GPU when it has one). On a machine without a GPU each
# prints why and exits 77, which ctest reports as skipped.
if(TARGET dpc_kernels_cuda)
  foreach(t test_cuda_kernels test_cuda_llama test_cuda_backend)
    add_executable(${t} ${CMAKE_SOURCE_DIR}/tests/unit/${t}.c)
    target_link_libraries(${t} PRIVATE dpc_kernels dpc_common)
    dpc_link_cuda(${t})
    string(REPLACE "test_" "" _name ${t})
    add_test(NAME ${_name} COMMAND ${t})
    set_tests_properties(${_name} PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
  endforeach()
  add_executable(test_cuda_oracle ${CMAKE_SOURCE_DIR}/tests/unit/test_cpu_oracle.c)
  target_link_libraries(test_cuda_oracle PRIVATE dpc_kernels dpc_common)
  dpc_link_cuda(test_cuda_oracle)
  add_test(NAME cuda_oracle
           COMMAND test_cuda_oracle ${CMAKE_SOURCE_DIR}/tests/oracle/gpt_oracle.py ${DPC_PYTHON} cuda)
  set_tests_properties(cuda_oracle PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77
                                              ENVIRONMENT DPC_ORACLE_DEVICE=auto)
endif()
# Throughput benchmark (not a test): tests/bench/gpu_train.sh runs it beside PyTorch.
if(TARGET dpc_kernels_cuda)
  add_executable(gpu_train ${CMAKE_SOURCE_DIR}/tests/bench/gpu_train.c)
  target_link_libraries(gpu_train PRIVATE dpc_kernels dpc_common)
  dpc_link_cuda(gpu_train)
endif()
