# coordinator/coordinator.cmake — the coordinator's core library dpc_coord (no gRPC, no libuv):
# job spec, blob store, streamed outer steps (outerio.c), SQLite store (store*.c), delta norm
# screen; and the daemon dipaco-coordinator (every other coordinator/*.c: RPC handlers,
# scheduling, loop, main).
# The admin CLI lives in ctl/ and is built from coordinator/CMakeLists.txt.
set(DPC_COORD_CORE jobspec.c blobs.c outerio.c delta_screen.c)
if(DIPACO_DISTRIBUTED)
  pkg_check_modules(SQLITE3 REQUIRED IMPORTED_TARGET sqlite3)
  file(GLOB DPC_STORE_SRC CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/store*.c)
  list(TRANSFORM DPC_COORD_CORE PREPEND ${CMAKE_CURRENT_SOURCE_DIR}/)
  add_library(dpc_coord STATIC ${DPC_COORD_CORE} ${DPC_STORE_SRC})
  target_link_libraries(dpc_coord PUBLIC dpc_kernels dpc_common PkgConfig::SQLITE3 OpenMP::OpenMP_C m)
endif()

# The coordinator daemon: every coordinator/*.c that is neither core nor CLI.
if(DIPACO_DISTRIBUTED AND TARGET dpc_rpc AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/main.c)
  pkg_check_modules(LIBUV REQUIRED IMPORTED_TARGET libuv)
  pkg_check_modules(LIBSYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
  pkg_check_modules(LIBCRYPTO REQUIRED IMPORTED_TARGET libcrypto)
  file(GLOB DPC_COORDD_SRC CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.c)
  list(REMOVE_ITEM DPC_COORDD_SRC ${DPC_COORD_CORE} ${DPC_STORE_SRC})
  add_executable(dipaco-coordinator ${DPC_COORDD_SRC})
  target_link_libraries(dipaco-coordinator PRIVATE dpc_coord dpc_rpc dpc_kernels dpc_common
    PkgConfig::LIBUV PkgConfig::LIBSYSTEMD PkgConfig::LIBCRYPTO Threads::Threads m)
  install(TARGETS dipaco-coordinator RUNTIME DESTINATION bin)
endif()
