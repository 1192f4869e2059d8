# worker/worker.cmake — the dipaco-worker daemon (included from worker/CMakeLists.txt with
# DIPACO_DISTRIBUTED): the lease loop (worker.c), its Coordinator calls (client.c) and main.
# dpc_worker is a library so that tests can drive the loop's helpers directly.
if(TARGET dpc_rpc)
  add_library(dpc_worker STATIC ${CMAKE_CURRENT_SOURCE_DIR}/worker.c ${CMAKE_CURRENT_SOURCE_DIR}/client.c)
  target_link_libraries(dpc_worker PUBLIC dpc_trainer dpc_rpc dpc_kernels dpc_common)
  add_executable(dipaco-worker ${CMAKE_CURRENT_SOURCE_DIR}/main.c)
  target_link_libraries(dipaco-worker PRIVATE dpc_worker dpc_trainer dpc_rpc dpc_kernels dpc_common)
  dpc_cuda_plugin(dipaco-worker)
  install(TARGETS dipaco-worker RUNTIME DESTINATION bin)
endif()
