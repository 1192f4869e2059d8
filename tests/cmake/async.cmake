# Asynchronous Local-SGD (diloco-async): three real workers with --slowdown 1, 2, 4 against a
# real coordinator; the ledger replayed through the reference outer rules
# (tests/oracle/async_replay.py). The outer-rule unit oracles live in coord_outer_oracle.
dpc_test(NAME async_e2e LABEL integration TIMEOUT 180 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/async_e2e.sh $<TARGET_FILE:dipacoctl>
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker>)

# No self-inflicted staleness: one worker + delayed Nesterov (N = 1, c = 0) equals the sync
# Nesterov job; two equal-speed workers stay within staleness 1; the ledger summary.
dpc_test(NAME async_fidelity LABEL integration TIMEOUT 180 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/async_fidelity.sh $<TARGET_FILE:dipacoctl>
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker>)
