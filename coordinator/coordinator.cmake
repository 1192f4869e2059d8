# coordinator/coordinator.cmake — the coordinator's core library dpc_coord: job spec, blob
# store, SQLite store and outer optimizer (no gRPC; the daemon links it with the RPC layer).
if(DIPACO_DISTRIBUTED)
  pkg_check_modules(SQLITE3 REQUIRED IMPORTED_TARGET sqlite3)
  add_library(dpc_coord STATIC
    ${CMAKE_CURRENT_SOURCE_DIR}/jobspec.c
    ${CMAKE_CURRENT_SOURCE_DIR}/blobs.c
    ${CMAKE_CURRENT_SOURCE_DIR}/store.c
    ${CMAKE_CURRENT_SOURCE_DIR}/outer.c)
  target_link_libraries(dpc_coord PUBLIC dpc_kernels dpc_common PkgConfig::SQLITE3 OpenMP::OpenMP_C m)
endif()
