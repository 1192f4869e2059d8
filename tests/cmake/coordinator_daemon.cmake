# Daemon-level tests of dipaco-coordinator: the real binary on loopback driven by a python
# grpcio client (tests/integration/coord_daemon.py; torch is the outer-step oracle).
if(TARGET dipaco-coordinator)
  add_test(NAME coord_daemon
           COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/coord_daemon.py
                   $<TARGET_FILE:dipaco-coordinator> ${CMAKE_SOURCE_DIR}/proto)
  set_tests_properties(coord_daemon PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
# The delta norm screen (outer.delta_norm_screen): scaled-up deltas refused, never applied.
if(TARGET dipaco-coordinator)
  add_test(NAME delta_screen
           COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/delta_screen.py
                   $<TARGET_FILE:dipaco-coordinator> ${CMAKE_SOURCE_DIR}/proto)
  set_tests_properties(delta_screen PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
# Flags refused before anything is served (listen ports, heartbeat vs lease TTL, TLS, auth).
if(TARGET dipaco-coordinator)
  add_test(NAME coord_flags COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/coord_flags.sh
                                    $<TARGET_FILE:dipaco-coordinator>)
  set_tests_properties(coord_flags PROPERTIES TIMEOUT 60)
endif()
