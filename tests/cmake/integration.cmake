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
# Replay pulls (docs/design.md §4.4): e3m0, fp8 and bf16 DiLoCo, e3m0 DiPaCo and Streaming
# DiLoCo and a SparseLoCo job, all with outer Nesterov momentum: replay on and off byte-identical
# with fewer bytes pulled (bf16 at R = 3: no replay, the same bytes); an undecodable stream, a
# mismatching one and a collected round each fall back to a whole pull.
dpc_test(NAME replay_dist LABEL integration TIMEOUT 400 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/replay_dist.sh ${DPC_DAEMONS})
