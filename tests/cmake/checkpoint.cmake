# inner.state "checkpoint": AdamW state uploaded at round end and resumed by another worker;
# the exported model must be byte-identical to the keep run without swaps.
dpc_test(NAME integration_checkpoint_e2e LABEL integration TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/checkpoint_e2e.sh
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
