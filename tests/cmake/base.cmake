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
