# Load: tests/load/dipaco_loadgen (N simulated workers speaking the real protocol against one
# coordinator). tests/bench/load.sh runs it with N = 1000 in a Release build; ctest runs a
# small version (load_small: 50 workers, 2 rounds) that asserts no delta is lost or doubled.
if(DIPACO_DISTRIBUTED)
  add_executable(dipaco_loadgen ${CMAKE_SOURCE_DIR}/tests/load/dipaco_loadgen.c)
  target_link_libraries(dipaco_loadgen PRIVATE dpc_rpc)
  # Benchmark helper (not a test): tests/bench/dataplane.sh builds and runs it.
  add_executable(dataplane_client EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/tests/bench/dataplane_client.c
                                                   ${CMAKE_SOURCE_DIR}/worker/storeget.c)
  pkg_check_modules(DPC_BENCH_CURL REQUIRED IMPORTED_TARGET libcurl)
  pkg_check_modules(DPC_BENCH_CRYPTO REQUIRED IMPORTED_TARGET libcrypto)
  target_link_libraries(dataplane_client PRIVATE dpc_rpc dpc_kernels PkgConfig::DPC_BENCH_CURL
                        PkgConfig::DPC_BENCH_CRYPTO)
endif()
dpc_test(NAME load_small LABEL integration TIMEOUT 120 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/load/run_load.sh
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipacoctl> $<TARGET_FILE:dipaco_loadgen> 50 2 4)
