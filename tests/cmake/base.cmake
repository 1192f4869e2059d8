# Tests of the base pieces: error table, layout, learning-rate schedule.
add_executable(test_base ${CMAKE_SOURCE_DIR}/tests/unit/test_base.c)
target_link_libraries(test_base PRIVATE dpc_kernels dpc_common)
add_test(NAME base COMMAND test_base)
set_tests_properties(base PROPERTIES TIMEOUT 30)

# The command-line parser every main uses (common/args.h).
add_executable(test_args ${CMAKE_SOURCE_DIR}/tests/unit/test_args.c)
target_link_libraries(test_args PRIVATE dpc_common)
add_test(NAME args COMMAND test_args)
set_tests_properties(args PROPERTIES TIMEOUT 30)

# The wire codecs (common/codec.h), with PyTorch as the oracle for bf16 rounding.
add_executable(test_codec ${CMAKE_SOURCE_DIR}/tests/unit/test_codec.c)
target_link_libraries(test_codec PRIVATE dpc_common)
add_test(NAME codec COMMAND test_codec)
add_test(NAME codec_oracle COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/codec_oracle.py $<TARGET_FILE:test_codec>)
set_tests_properties(codec PROPERTIES TIMEOUT 60)
set_tests_properties(codec_oracle PROPERTIES TIMEOUT 240)

# SparseLoCo's sparse delta codec (common/sparse.h), with an independent numpy implementation
# of the format as the oracle.
add_executable(test_sparse ${CMAKE_SOURCE_DIR}/tests/unit/test_sparse.c)
target_link_libraries(test_sparse PRIVATE dpc_common OpenMP::OpenMP_C)
add_test(NAME sparse COMMAND test_sparse)
add_test(NAME sparse_oracle COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/sparse_oracle.py $<TARGET_FILE:test_sparse>)
set_tests_properties(sparse PROPERTIES TIMEOUT 60)
set_tests_properties(sparse_oracle PROPERTIES TIMEOUT 120)
