# inner.state "checkpoint": AdamW state uploaded at round end and resumed by another worker;
# the exported model must be byte-identical to the keep run without swaps.
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  add_test(NAME integration_checkpoint_e2e COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/checkpoint_e2e.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(integration_checkpoint_e2e PROPERTIES TIMEOUT 300)
endif()
