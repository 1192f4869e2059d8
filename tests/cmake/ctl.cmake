# dipacoctl's offline tools end to end (tests/integration/ctl_offline.sh).
if(TARGET dipacoctl)
  add_test(NAME ctl_offline COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/ctl_offline.sh $<TARGET_FILE:dipacoctl>)
  set_tests_properties(ctl_offline PROPERTIES TIMEOUT 300)
endif()
