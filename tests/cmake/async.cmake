# Asynchronous Local-SGD (diloco-async): three real workers with --slowdown 1, 2, 4 against a
# real coordinator; the ledger replayed through the reference outer rules
# (tests/oracle/async_replay.py). The outer-rule unit oracles live in coord_outer_oracle.
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  add_test(NAME async_e2e
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/async_e2e.sh $<TARGET_FILE:dipacoctl>
                   $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker>)
  set_tests_properties(async_e2e PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
endif()

# No self-inflicted staleness (issue 11): one worker + delayed Nesterov (N = 1, c = 0) equals
# the sync Nesterov job; two equal-speed workers stay within staleness 1; the ledger summary.
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  add_test(NAME async_fidelity
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/async_fidelity.sh $<TARGET_FILE:dipacoctl>
                   $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker>)
  set_tests_properties(async_fidelity PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
endif()
