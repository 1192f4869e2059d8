# Real daemons on loopback: the DiLoCo test of record against PyTorch, and a worker SIGKILLed
# mid-round. Registered once the coordinator and worker binaries exist in this build.
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  foreach(t diloco_dist worker_kill)
    add_test(NAME integration_${t} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/${t}.sh
             $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
    set_tests_properties(integration_${t} PROPERTIES TIMEOUT 400)
  endforeach()
endif()
# I/O fault injection (DIPACO_TEST_IO_FAULT): failed blob fsync/rename and SQLite writes/fsyncs
# leave the state recoverable; the job still ends bit-identical to a fault-free run.
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  add_test(NAME io_fault COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/io_fault.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(io_fault PROPERTIES TIMEOUT 300 LABELS fault)
endif()
