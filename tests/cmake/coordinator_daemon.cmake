# Daemon-level tests of dipaco-coordinator: the real binary on loopback driven by a python
# grpcio client (tests/integration/coord_daemon.py; torch is the outer-step oracle).
dpc_test(NAME coord_daemon LABEL integration TIMEOUT 120 REQUIRES DISTRIBUTED
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/coord_daemon.py
                 $<TARGET_FILE:dipaco-coordinator> ${CMAKE_SOURCE_DIR}/proto)
# The delta norm screen (outer.delta_norm_screen): scaled-up deltas refused, never applied.
dpc_test(NAME delta_screen LABEL integration TIMEOUT 120 REQUIRES DISTRIBUTED
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/delta_screen.py
                 $<TARGET_FILE:dipaco-coordinator> ${CMAKE_SOURCE_DIR}/proto)
# Quantized deltas in PushDelta (streaming.codec e3m0 / int8): malformed streams refused and
# never stored, the outer step over the decoded deltas, received bytes as sent.
dpc_test(NAME codec_push LABEL integration TIMEOUT 120 REQUIRES DISTRIBUTED
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/codec_push.py
                 $<TARGET_FILE:dipaco-coordinator> ${CMAKE_SOURCE_DIR}/proto)
# SparseLoCo deltas in PushDelta (job spec "sparse", CODEC_SPARSE): malformed streams refused,
# counted and never stored, the outer step over the decoded streams, PAYLOAD_SPARSE_ROUND pulls.
dpc_test(NAME sparse_push LABEL integration TIMEOUT 120 REQUIRES DISTRIBUTED
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/sparse_push.py
                 $<TARGET_FILE:dipaco-coordinator> ${CMAKE_SOURCE_DIR}/proto)
# Flags refused before anything is served (listen ports, heartbeat vs lease TTL, TLS, auth).
dpc_test(NAME coord_flags LABEL integration TIMEOUT 60 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/coord_flags.sh $<TARGET_FILE:dipaco-coordinator>)
