# worker/worker.cmake — the dipaco-worker daemon (included from worker/CMakeLists.txt with
# DIPACO_DISTRIBUTED): the register / lease loop (worker.c), one lease (lease.c, plan.c,
# slot.c, sparseloco.c, replay.c, heartbeat.c), data paths and placement (data.c), stop control (stop.c), its
# Coordinator calls (client.c), reads from and writes to the object store (storeget.c, storeput.c)
# and main. dpc_worker is a
# library so that tests can drive the loop's helpers directly.
if(TARGET dpc_rpc)
  set(DPC_WORKER_SOURCES client.c client_put.c data.c heartbeat.c lease.c plan.c replay.c slot.c sparseloco.c stop.c storeget.c storeput.c
      stream.c worker.c)
  list(TRANSFORM DPC_WORKER_SOURCES PREPEND ${CMAKE_CURRENT_SOURCE_DIR}/)
  add_library(dpc_worker STATIC ${DPC_WORKER_SOURCES})
  pkg_check_modules(LIBCURL REQUIRED IMPORTED_TARGET libcurl)
  pkg_check_modules(LIBCRYPTO REQUIRED IMPORTED_TARGET libcrypto)
  target_link_libraries(dpc_worker PUBLIC dpc_trainer dpc_rpc dpc_kernels dpc_common PkgConfig::LIBCURL
                        PkgConfig::LIBCRYPTO)
  add_executable(dipaco-worker ${CMAKE_CURRENT_SOURCE_DIR}/main.c)
  target_link_libraries(dipaco-worker PRIVATE dpc_worker dpc_trainer dpc_rpc dpc_kernels dpc_common)
  dpc_cuda_plugin(dipaco-worker)
  install(TARGETS dipaco-worker RUNTIME DESTINATION bin)
endif()
