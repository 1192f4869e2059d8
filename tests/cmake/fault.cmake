# Fault tolerance: the coordinator SIGKILLed at each named crash point (coordinator/testhook.h)
# must lose and double nothing and end byte-identical to a fault-free run;
# tests/chaos/ is the test of record that kills workers and the coordinator at random.
# coord_crash.sh COORDINATOR WORKER DIPACOCTL POINT:HITS [async]
set(DPC_COORD_CRASH bash ${CMAKE_SOURCE_DIR}/tests/integration/coord_crash.sh ${DPC_DAEMONS})
dpc_test(NAME coord_crash_pull LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED COMMAND ${DPC_COORD_CRASH} pull:10)
dpc_test(NAME coord_crash_push LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED COMMAND ${DPC_COORD_CRASH} push:10)
dpc_test(NAME coord_crash_push-commit LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED COMMAND ${DPC_COORD_CRASH} push-commit:3)
dpc_test(NAME coord_crash_push-ack LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED COMMAND ${DPC_COORD_CRASH} push-ack:3)
dpc_test(NAME coord_crash_outer LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED COMMAND ${DPC_COORD_CRASH} outer:2)
dpc_test(NAME coord_crash_outer-momentum LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND ${DPC_COORD_CRASH} outer-momentum:2)
dpc_test(NAME coord_crash_gc LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED COMMAND ${DPC_COORD_CRASH} gc:2)
# The same for a one-slot diloco-async job (deterministic: no self-inflicted staleness).
dpc_test(NAME coord_crash_async_push-ack LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED COMMAND ${DPC_COORD_CRASH} push-ack:3 async)
dpc_test(NAME coord_crash_async_outer LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED COMMAND ${DPC_COORD_CRASH} outer:3 async)
dpc_test(NAME coord_crash_async_gc LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED COMMAND ${DPC_COORD_CRASH} gc:2 async)
# Workers and the coordinator killed at random (CHAOS_ALGO: diloco by default).
dpc_test(NAME chaos LABEL fault TIMEOUT 600 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/chaos/chaos.sh ${DPC_DAEMONS})
dpc_test(NAME chaos_async LABEL fault TIMEOUT 600 REQUIRES DISTRIBUTED ENVIRONMENT CHAOS_ALGO=async
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/chaos/chaos.sh ${DPC_DAEMONS})
dpc_test(NAME chaos_streaming LABEL fault TIMEOUT 600 REQUIRES DISTRIBUTED ENVIRONMENT CHAOS_ALGO=streaming
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/chaos/chaos.sh ${DPC_DAEMONS})
dpc_test(NAME chaos_sparse LABEL fault TIMEOUT 600 REQUIRES DISTRIBUTED ENVIRONMENT CHAOS_ALGO=sparse
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/chaos/chaos.sh ${DPC_DAEMONS})
# MuLoCo under the same kills: Muon's momentum buffers in the checkpointed inner state.
dpc_test(NAME chaos_muon LABEL fault TIMEOUT 600 REQUIRES DISTRIBUTED ENVIRONMENT CHAOS_OPTIMIZER=muon
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/chaos/chaos.sh ${DPC_DAEMONS})
dpc_test(NAME chaos_replay LABEL fault TIMEOUT 600 REQUIRES DISTRIBUTED ENVIRONMENT CHAOS_ALGO=replay
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/chaos/chaos.sh ${DPC_DAEMONS})
dpc_test(NAME outer_corrupt LABEL fault TIMEOUT 180 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/outer_corrupt.sh ${DPC_DAEMONS})
dpc_test(NAME lease_errors LABEL fault TIMEOUT 180 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/lease_errors.sh ${DPC_DAEMONS})
# A SIGKILLed worker's slot goes to the spare after a few missed heartbeats, not after the
# lease TTL, and the result equals the fault-free run.
dpc_test(NAME fast_failover LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/fast_failover.sh ${DPC_DAEMONS})
# A quorum round closes quorum_grace_s after its quorum, not at its deadline.
dpc_test(NAME quorum_grace LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/quorum_grace.sh ${DPC_DAEMONS})
# A worker cut off by the grace window stops at once (Watch lease_ended); a round whose missing
# slots no connected worker holds closes at its quorum.
dpc_test(NAME quorum_early LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/quorum_early.sh ${DPC_DAEMONS})
