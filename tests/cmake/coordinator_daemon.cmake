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
# Quantized deltas in PushDelta (streaming.codec e3m0 / int8): malformed streams refused and
# never stored, the outer step over the decoded deltas, received bytes as sent.
if(TARGET dipaco-coordinator)
  add_test(NAME codec_push
           COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/codec_push.py
                   $<TARGET_FILE:dipaco-coordinator> ${CMAKE_SOURCE_DIR}/proto)
  set_tests_properties(codec_push PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
# SparseLoCo deltas in PushDelta (job spec "sparse", CODEC_SPARSE): malformed streams refused,
# counted and never stored, the outer step over the decoded streams, PAYLOAD_SPARSE_ROUND pulls.
if(TARGET dipaco-coordinator)
  add_test(NAME sparse_push
           COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/sparse_push.py
                   $<TARGET_FILE:dipaco-coordinator> ${CMAKE_SOURCE_DIR}/proto)
  set_tests_properties(sparse_push PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
# Flags refused before anything is served (listen ports, heartbeat vs lease TTL, TLS, auth).
if(TARGET dipaco-coordinator)
  add_test(NAME coord_flags COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/coord_flags.sh
                                    $<TARGET_FILE:dipaco-coordinator>)
  set_tests_properties(coord_flags PROPERTIES TIMEOUT 60)
endif()
