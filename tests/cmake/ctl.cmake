# dipacoctl's offline tools end to end (tests/integration/ctl_offline.sh).
dpc_test(NAME ctl_offline LABEL integration TIMEOUT 300
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/ctl_offline.sh $<TARGET_FILE:dipacoctl>)
