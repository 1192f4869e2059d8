# Asynchronous Local-SGD (diloco-async): three real workers with --slowdown 1, 2, 4 against a
# real coordinator; the ledger replayed through the reference outer rules
# (tests/oracle/async_replay.py). The outer-rule unit oracles live in coord_outer_oracle.
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  add_test(NAME async_e2e
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/async_e2e.sh $<TARGET_FILE:dipacoctl>
                   $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker>)
  set_tests_properties(async_e2e PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
endif()
