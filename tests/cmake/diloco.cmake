# Single-process DiLoCo (trainer + outer optimizer) against the PyTorch DiLoCo reference.
add_executable(diloco_local ${CMAKE_SOURCE_DIR}/tests/unit/diloco_local.c)
target_link_libraries(diloco_local PRIVATE dpc_trainer dpc_kernels dpc_common OpenMP::OpenMP_C)
dpc_cuda_plugin(diloco_local) # DILOCO_LOCAL_BACKENDS=cuda,cpu: tests/gpu/hetero_diloco.sh
dpc_test(NAME oracle_diloco_local LABEL oracle TIMEOUT 300
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/diloco_local.sh
                 $<TARGET_FILE:dipacoctl> $<TARGET_FILE:diloco_local>)
