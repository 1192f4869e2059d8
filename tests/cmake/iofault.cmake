# The process-wide I/O fault injector (DIPACO_TEST_IO_FAULT, common/fsutil.h) on its own; its
# use against the coordinator is tests/integration/io_fault.sh (tests/cmake/integration.cmake).
add_executable(test_io_fault ${CMAKE_SOURCE_DIR}/tests/unit/test_io_fault.c)
target_link_libraries(test_io_fault PRIVATE dpc_common)
dpc_test(NAME io_fault_injector LABEL unit TIMEOUT 60 COMMAND test_io_fault)
