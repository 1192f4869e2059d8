# Tests of the compute kernels: the CPU backend against PyTorch (the oracle must run: torch
# missing is a failure), finite differences, and determinism / API state checks.
add_executable(test_cpu_oracle ${CMAKE_SOURCE_DIR}/tests/unit/test_cpu_oracle.c)
target_link_libraries(test_cpu_oracle PRIVATE dpc_kernels dpc_common)
dpc_test(NAME cpu_oracle LABEL oracle TIMEOUT 120
         COMMAND test_cpu_oracle ${CMAKE_SOURCE_DIR}/tests/oracle/gpt_oracle.py ${DPC_PYTHON})

add_executable(test_cpu_gradcheck ${CMAKE_SOURCE_DIR}/tests/unit/test_cpu_gradcheck.c)
target_link_libraries(test_cpu_gradcheck PRIVATE dpc_kernels dpc_common)
dpc_test(NAME cpu_gradcheck LABEL unit TIMEOUT 60 COMMAND test_cpu_gradcheck)

add_executable(test_cpu_determinism ${CMAKE_SOURCE_DIR}/tests/unit/test_cpu_determinism.c)
target_link_libraries(test_cpu_determinism PRIVATE dpc_kernels dpc_common)
dpc_test(NAME cpu_determinism LABEL unit TIMEOUT 60 COMMAND test_cpu_determinism)

# dipaco's AVX-512 matrix product: skips on a CPU without AVX-512 (tests/expected_skips.txt).
add_executable(test_cpu_gemm ${CMAKE_SOURCE_DIR}/tests/unit/test_cpu_gemm.c)
target_link_libraries(test_cpu_gemm PRIVATE dpc_kernels dpc_common)
dpc_test(NAME cpu_gemm LABEL unit TIMEOUT 120 SKIP_OK COMMAND test_cpu_gemm)

# Build check: the AVX-512 and AVX2 copies of the AdamW loop are vector code (no libm sqrtf), in
# the kernels a test program links, or in the sanitizer build their sanitizer-free twin
# (kernels/CMakeLists.txt). x86-64 only: skips elsewhere (tests/expected_skips.txt).
if(DIPACO_SANITIZE)
  set(_dpc_simd_bin $<TARGET_OBJECTS:dpc_cpu_kernels_plain>)
else()
  set(_dpc_simd_bin $<TARGET_FILE:test_cpu_determinism>)
endif()
dpc_test(NAME kernels_adamw_simd LABEL unit TIMEOUT 60 SKIP_OK
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/unit/check_adamw_simd.sh ${_dpc_simd_bin})

# Micro-benchmark of one train step (not a test): tests/bench/cpu_kernels.c, twin cpu_kernels_torch.py.
add_executable(bench_cpu_kernels EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/tests/bench/cpu_kernels.c)
target_link_libraries(bench_cpu_kernels PRIVATE dpc_kernels dpc_common)
# The sgemm peak of tests/bench/cpu_train.sh (not a test): tests/bench/cpu_sgemm_peak.c.
add_executable(bench_cpu_sgemm_peak EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/tests/bench/cpu_sgemm_peak.c)
target_link_libraries(bench_cpu_sgemm_peak PRIVATE dpc_kernels)

# DiPaCo routing: k-means / product k-means on planted clusters, routing features, router
# directories (kernels/kmeans.h, kernels/router.h).
add_executable(test_kmeans ${CMAKE_SOURCE_DIR}/tests/unit/test_kmeans.c)
target_link_libraries(test_kmeans PRIVATE dpc_kernels dpc_common)
dpc_test(NAME kmeans LABEL unit TIMEOUT 60 COMMAND test_kmeans)
# Muon's step against AdamW's and a forward + backward (not a test): tests/bench/muon_step.c.
add_executable(bench_muon_step EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/tests/bench/muon_step.c)
target_link_libraries(bench_muon_step PRIVATE dpc_kernels dpc_common)
