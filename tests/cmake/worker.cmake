# Tests of the worker daemon (worker/): dipaco-worker as a real process against a fake
# coordinator (tests/unit/test_worker.c), plus its data-path and placement helpers.
if(TARGET dipaco-worker)
  add_executable(test_worker ${CMAKE_SOURCE_DIR}/tests/unit/test_worker.c)
  target_link_libraries(test_worker PRIVATE dpc_worker dpc_trainer dpc_rpc dpc_kernels dpc_common)
  add_test(NAME worker COMMAND test_worker $<TARGET_FILE:dipaco-worker>)
  set_tests_properties(worker PROPERTIES TIMEOUT 180)
endif()

# Two workers and a real coordinator, two jobs at once, checked bit-for-bit against the
# single-process DiLoCo run and against the PyTorch reference.
if(TARGET dipaco-worker AND TARGET dipaco-coordinator AND TARGET dipacoctl AND TARGET diloco_local)
  add_test(NAME worker_e2e
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/worker_e2e.sh $<TARGET_FILE:dipacoctl>
                   $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:diloco_local>)
  set_tests_properties(worker_e2e PROPERTIES TIMEOUT 240)
endif()

# The coordinator killed (SIGKILL) and restarted mid-job: the workers ride it out and the
# result stays bit-identical.
if(TARGET dipaco-worker AND TARGET dipaco-coordinator AND TARGET dipacoctl AND TARGET diloco_local)
  add_test(NAME worker_restart
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/worker_restart.sh $<TARGET_FILE:dipacoctl>
                   $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:diloco_local>)
  set_tests_properties(worker_restart PROPERTIES TIMEOUT 240)
endif()

# Preemption: SIGTERM mid-round in an async job pushes the partial delta (counted for its
# steps) and exits 0; SIGTERM during a Lease long-poll exits at once.
if(TARGET dipaco-worker AND TARGET dipaco-coordinator AND TARGET dipacoctl)
  add_test(NAME worker_sigterm
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/worker_sigterm.sh $<TARGET_FILE:dipaco-coordinator>
                   $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(worker_sigterm PROPERTIES TIMEOUT 180 LABELS fault)
endif()

# Preemption in a sync job weighted by tokens: the SIGTERMed worker's partial delta merges;
# in an exact job the lease is released instead; goodput in job show counts both.
if(TARGET dipaco-worker AND TARGET dipaco-coordinator AND TARGET dipacoctl)
  add_test(NAME partial_push
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/partial_push.sh $<TARGET_FILE:dipaco-coordinator>
                   $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(partial_push PROPERTIES TIMEOUT 180 LABELS fault)
endif()
