# coordinator/coordinator.cmake — the coordinator's core library dpc_coord: job spec, blob
# store, SQLite store, outer optimizer, delta norm screen (no gRPC; the daemon links it with
# the RPC layer).
if(DIPACO_DISTRIBUTED)
  pkg_check_modules(SQLITE3 REQUIRED IMPORTED_TARGET sqlite3)
  add_library(dpc_coord STATIC
    ${CMAKE_CURRENT_SOURCE_DIR}/jobspec.c
    ${CMAKE_CURRENT_SOURCE_DIR}/blobs.c
    ${CMAKE_CURRENT_SOURCE_DIR}/store.c
    ${CMAKE_CURRENT_SOURCE_DIR}/store_history.c
    ${CMAKE_CURRENT_SOURCE_DIR}/store_live.c
    ${CMAKE_CURRENT_SOURCE_DIR}/store_fault.c
    ${CMAKE_CURRENT_SOURCE_DIR}/outer.c
    ${CMAKE_CURRENT_SOURCE_DIR}/screen.c)
  target_link_libraries(dpc_coord PUBLIC dpc_kernels dpc_common PkgConfig::SQLITE3 OpenMP::OpenMP_C m)
endif()

# The coordinator daemon (coordinator/main.c, service.c, innerstate.c, admin.c, sched.c, metrics.c).
if(DIPACO_DISTRIBUTED AND TARGET dpc_rpc AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/main.c)
  pkg_check_modules(LIBUV REQUIRED IMPORTED_TARGET libuv)
  pkg_check_modules(LIBSYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
  pkg_check_modules(LIBCRYPTO REQUIRED IMPORTED_TARGET libcrypto)
  add_executable(dipaco-coordinator
    ${CMAKE_CURRENT_SOURCE_DIR}/main.c
    ${CMAKE_CURRENT_SOURCE_DIR}/service.c
    ${CMAKE_CURRENT_SOURCE_DIR}/innerstate.c
    ${CMAKE_CURRENT_SOURCE_DIR}/admin.c
    ${CMAKE_CURRENT_SOURCE_DIR}/sched.c
    ${CMAKE_CURRENT_SOURCE_DIR}/metrics.c
    ${CMAKE_CURRENT_SOURCE_DIR}/testhook.c)
  target_link_libraries(dipaco-coordinator PRIVATE dpc_coord dpc_rpc dpc_kernels dpc_common
    PkgConfig::LIBUV PkgConfig::LIBSYSTEMD PkgConfig::LIBCRYPTO Threads::Threads m)
  install(TARGETS dipaco-coordinator RUNTIME DESTINATION bin)
endif()
