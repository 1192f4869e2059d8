# Real daemons on loopback: the DiLoCo test of record against PyTorch, and a worker SIGKILLed
# mid-round.
dpc_test(NAME integration_diloco_dist LABEL integration TIMEOUT 400 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/diloco_dist.sh ${DPC_DAEMONS})
dpc_test(NAME integration_worker_kill LABEL fault TIMEOUT 400 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/worker_kill.sh ${DPC_DAEMONS})
# I/O fault injection (DIPACO_TEST_IO_FAULT): failed blob fsync/rename and SQLite writes/fsyncs
# leave the state recoverable; the job still ends bit-identical to a fault-free run.
dpc_test(NAME io_fault LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/io_fault.sh ${DPC_DAEMONS})
