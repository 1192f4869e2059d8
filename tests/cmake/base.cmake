# Tests of the base pieces: error table, layout, learning-rate schedule.
add_executable(test_base ${CMAKE_SOURCE_DIR}/tests/unit/test_base.c)
target_link_libraries(test_base PRIVATE dpc_kernels dpc_common)
dpc_test(NAME base LABEL unit TIMEOUT 30 COMMAND test_base)

# The command-line parser every main uses (common/args.h).
add_executable(test_args ${CMAKE_SOURCE_DIR}/tests/unit/test_args.c)
target_link_libraries(test_args PRIVATE dpc_common)
dpc_test(NAME args LABEL unit TIMEOUT 30 COMMAND test_args)

# The wire codecs (common/codec.h), with PyTorch as the oracle for bf16 rounding.
add_executable(test_codec ${CMAKE_SOURCE_DIR}/tests/unit/test_codec.c)
target_link_libraries(test_codec PRIVATE dpc_common)
dpc_test(NAME codec LABEL unit TIMEOUT 60 COMMAND test_codec)
dpc_test(NAME codec_oracle LABEL oracle TIMEOUT 240
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/codec_oracle.py $<TARGET_FILE:test_codec>)

# SparseLoCo's sparse delta codec (common/sparse.h), with an independent numpy implementation
# of the format as the oracle.
add_executable(test_sparse ${CMAKE_SOURCE_DIR}/tests/unit/test_sparse.c)
target_link_libraries(test_sparse PRIVATE dpc_common OpenMP::OpenMP_C)
dpc_test(NAME sparse LABEL unit TIMEOUT 60 COMMAND test_sparse)
dpc_test(NAME sparse_oracle LABEL oracle TIMEOUT 120
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/sparse_oracle.py $<TARGET_FILE:test_sparse>)
