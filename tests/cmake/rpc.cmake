# Tests of the gRPC call layer (common/rpc*.c, proto/): the C end-to-end test and a python
# grpcio client against a small C test server. Only with the distributed build.
if(TARGET dpc_rpc)
  add_executable(test_rpc ${CMAKE_SOURCE_DIR}/tests/unit/test_rpc.c)
  target_link_libraries(test_rpc PRIVATE dpc_rpc)
  add_test(NAME rpc COMMAND test_rpc)
  set_tests_properties(rpc PROPERTIES TIMEOUT 120)

  add_executable(test_rpc_pyserver ${CMAKE_SOURCE_DIR}/tests/unit/test_rpc_pyserver.c)
  target_link_libraries(test_rpc_pyserver PRIVATE dpc_rpc)
  add_test(NAME rpc_python
           COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/rpc_grpcio.py
                   $<TARGET_FILE:test_rpc_pyserver> ${CMAKE_SOURCE_DIR}/proto)
  set_tests_properties(rpc_python PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77)
endif()

# Loopback transfer benchmark (tests/bench/transfer.sh builds and runs it; not a test).
if(TARGET dpc_rpc)
  add_executable(transfer_bench EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/tests/bench/transfer_bench.c)
  target_link_libraries(transfer_bench PRIVATE dpc_rpc)
endif()
