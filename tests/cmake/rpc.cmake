# Tests of the gRPC call layer (common/rpc*.c, proto/): the C end-to-end test and a python
# grpcio client against a small C test server. Only the distributed build has the layer.
if(DIPACO_DISTRIBUTED)
  add_executable(test_rpc ${CMAKE_SOURCE_DIR}/tests/unit/test_rpc.c)
  target_link_libraries(test_rpc PRIVATE dpc_rpc)
  add_executable(test_rpc_pyserver ${CMAKE_SOURCE_DIR}/tests/unit/test_rpc_pyserver.c)
  target_link_libraries(test_rpc_pyserver PRIVATE dpc_rpc)
  # Loopback transfer benchmark (tests/bench/transfer.sh builds and runs it; not a test).
  add_executable(transfer_bench EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/tests/bench/transfer_bench.c)
  target_link_libraries(transfer_bench PRIVATE dpc_rpc)
endif()
dpc_test(NAME rpc LABEL unit TIMEOUT 120 REQUIRES DISTRIBUTED COMMAND test_rpc)
dpc_test(NAME rpc_python LABEL oracle TIMEOUT 60 REQUIRES DISTRIBUTED
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/rpc_grpcio.py
                 $<TARGET_FILE:test_rpc_pyserver> ${CMAKE_SOURCE_DIR}/proto)
