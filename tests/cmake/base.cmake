# Tests of the base pieces: error table, layout, learning-rate schedule.
add_executable(test_base ${CMAKE_SOURCE_DIR}/tests/unit/test_base.c)
target_link_libraries(test_base PRIVATE dpc_kernels dpc_common)
add_test(NAME base COMMAND test_base)
set_tests_properties(base PROPERTIES TIMEOUT 30)
