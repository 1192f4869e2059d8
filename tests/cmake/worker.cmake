# Tests of the worker daemon (worker/): dipaco-worker as a real process against a fake
# coordinator (tests/unit/test_worker.c), plus its data-path and placement helpers.
if(DIPACO_DISTRIBUTED)
  add_executable(test_worker ${CMAKE_SOURCE_DIR}/tests/unit/test_worker.c)
  target_link_libraries(test_worker PRIVATE dpc_worker dpc_trainer dpc_rpc dpc_kernels dpc_common)
endif()
dpc_test(NAME worker LABEL integration TIMEOUT 180 REQUIRES DISTRIBUTED
         COMMAND test_worker $<TARGET_FILE:dipaco-worker>)

# Two workers and a real coordinator, two jobs at once, checked bit-for-bit against the
# single-process DiLoCo run and against the PyTorch reference.
dpc_test(NAME worker_e2e LABEL integration TIMEOUT 240 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/worker_e2e.sh $<TARGET_FILE:dipacoctl>
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:diloco_local>)

# The coordinator killed (SIGKILL) and restarted mid-job: the workers ride it out and the
# result stays bit-identical.
dpc_test(NAME worker_restart LABEL fault TIMEOUT 240 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/worker_restart.sh $<TARGET_FILE:dipacoctl>
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:diloco_local>)

# Preemption: SIGTERM mid-round in an async job pushes the partial delta (counted for its
# steps) and exits 0; SIGTERM during a Lease long-poll exits at once.
dpc_test(NAME worker_sigterm LABEL fault TIMEOUT 180 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/worker_sigterm.sh ${DPC_DAEMONS})

# Preemption in a sync job weighted by tokens: the SIGTERMed worker's partial delta merges;
# in an exact job the lease is released instead; goodput in job show counts both.
dpc_test(NAME partial_push LABEL fault TIMEOUT 180 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/partial_push.sh ${DPC_DAEMONS})
