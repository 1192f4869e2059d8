# Bounded resources of the coordinator (issue 13): paged worker listings and the deletion of
# long-gone workers (python grpcio and dipacoctl against the real daemon).
if(TARGET dipaco-coordinator AND TARGET dipacoctl)
  add_test(NAME resources_workers
           COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/resources_workers.py
                   $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipacoctl> ${CMAKE_SOURCE_DIR}/proto)
  set_tests_properties(resources_workers PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
# Connection exhaustion under a low open-file limit, handshake and idle timeouts, the
# listener self-check (a restart loop plays systemd).
if(TARGET dipaco-coordinator AND TARGET dipacoctl)
  add_test(NAME resources_conn
           COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/resources_conn.py
                   $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(resources_conn PROPERTIES TIMEOUT 180)
endif()
# The memory estimate at job create: over --memory-budget-mb → RESOURCE_EXHAUSTED.
if(TARGET dipaco-coordinator)
  add_test(NAME resources_memory
           COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/resources_memory.py
                   $<TARGET_FILE:dipaco-coordinator> ${CMAKE_SOURCE_DIR}/proto)
  set_tests_properties(resources_memory PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
