# Tests of the CUDA backend (kernels/cuda), built whenever it is (DIPACO_CUDA AUTO/ON with
# nvcc): each kernel against its CPU twin (GPT-2's in test_cuda_kernels, the Llama-class
# layers' in test_cuda_llama), the whole model against the CPU backend in fp32,
# tf32 and bf16, and the PyTorch oracle (torch on the GPU when it has one). On a machine
# without a GPU each prints why and exits 77; without the CUDA toolkit they are registered
# as skips saying so (both listed in tests/expected_skips.txt).
if(DPC_HAVE_CUDA)
  foreach(t test_cuda_kernels test_cuda_llama test_cuda_backend)
    add_executable(${t} ${CMAKE_SOURCE_DIR}/tests/unit/${t}.c)
    target_link_libraries(${t} PRIVATE dpc_kernels dpc_common)
    dpc_link_cuda(${t})
  endforeach()
  add_executable(test_cuda_oracle ${CMAKE_SOURCE_DIR}/tests/unit/test_cpu_oracle.c)
  target_link_libraries(test_cuda_oracle PRIVATE dpc_kernels dpc_common)
  dpc_link_cuda(test_cuda_oracle)
  add_executable(test_cuda_llama_oracle ${CMAKE_SOURCE_DIR}/tests/unit/test_llama_oracle.c)
  target_link_libraries(test_cuda_llama_oracle PRIVATE dpc_kernels dpc_common)
  dpc_link_cuda(test_cuda_llama_oracle)
  # The Llama passes' wiring with no GPU: cuda_llama_model.cu compiled as host C++ (the CUDA
  # headers only) against stand-ins for the launchers, the product and the runtime's copies.
  enable_language(CXX)
  add_executable(test_cuda_llama_wiring ${CMAKE_SOURCE_DIR}/tests/unit/test_cuda_llama_wiring.cc)
  target_include_directories(test_cuda_llama_wiring PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_options(test_cuda_llama_wiring PRIVATE -Wall -Wextra)
  if(DIPACO_SANITIZE)
    target_compile_options(test_cuda_llama_wiring PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                                          -fno-sanitize-recover=undefined)
  endif()
  target_link_libraries(test_cuda_llama_wiring PRIVATE dpc_kernels dpc_common)
  # Muon's host code likewise (cuda_muon.cu against the CPU backend's gpt_muon_step).
  add_executable(test_cuda_muon_wiring ${CMAKE_SOURCE_DIR}/tests/unit/test_cuda_muon_wiring.cc)
  target_include_directories(test_cuda_muon_wiring PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_options(test_cuda_muon_wiring PRIVATE -Wall -Wextra)
  if(DIPACO_SANITIZE)
    target_compile_options(test_cuda_muon_wiring PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                                         -fno-sanitize-recover=undefined)
  endif()
  target_link_libraries(test_cuda_muon_wiring PRIVATE dpc_kernels dpc_common)
  # Throughput benchmark (not a test): tests/bench/gpu_train.sh runs it beside PyTorch.
  add_executable(gpu_train ${CMAKE_SOURCE_DIR}/tests/bench/gpu_train.c)
  target_link_libraries(gpu_train PRIVATE dpc_kernels dpc_common)
  dpc_link_cuda(gpu_train)
endif()
# Programs that load the plugin export what it takes from them (dipaco-worker when built).
set(DPC_PLUGIN_PROGRAMS $<TARGET_FILE:dipacoctl> $<TARGET_FILE:diloco_local>)
if(DIPACO_DISTRIBUTED)
  list(APPEND DPC_PLUGIN_PROGRAMS $<TARGET_FILE:dipaco-worker>)
endif()
dpc_test(NAME cuda_plugin_symbols LABEL arch TIMEOUT 60 SKIP_OK REQUIRES CUDA
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/unit/cuda_plugin_symbols.sh $<TARGET_FILE:dipaco-cuda>
                 $<TARGET_FILE:dpc_kernels> $<TARGET_FILE:dpc_common> -- ${DPC_PLUGIN_PROGRAMS})
dpc_test(NAME cuda_kernels LABEL unit TIMEOUT 120 SKIP_OK REQUIRES CUDA COMMAND test_cuda_kernels)
dpc_test(NAME cuda_llama LABEL unit TIMEOUT 120 SKIP_OK REQUIRES CUDA COMMAND test_cuda_llama)
dpc_test(NAME cuda_backend LABEL unit TIMEOUT 120 SKIP_OK REQUIRES CUDA COMMAND test_cuda_backend)
dpc_test(NAME cuda_oracle LABEL oracle TIMEOUT 120 SKIP_OK REQUIRES CUDA
         COMMAND test_cuda_oracle ${CMAKE_SOURCE_DIR}/tests/oracle/gpt_oracle.py ${DPC_PYTHON} cuda
         ENVIRONMENT DPC_ORACLE_DEVICE=auto)
dpc_test(NAME cuda_llama_oracle LABEL oracle TIMEOUT 120 SKIP_OK REQUIRES CUDA
         COMMAND test_cuda_llama_oracle ${CMAKE_SOURCE_DIR}/tests/oracle/llama_oracle.py ${DPC_PYTHON} cuda)
dpc_test(NAME cuda_llama_wiring LABEL unit TIMEOUT 120 SKIP_OK REQUIRES CUDA COMMAND test_cuda_llama_wiring)
dpc_test(NAME cuda_muon_wiring LABEL unit TIMEOUT 120 SKIP_OK REQUIRES CUDA COMMAND test_cuda_muon_wiring)
