# Bounded resources of the coordinator: paged worker listings and the deletion of long-gone
# workers (python grpcio and dipacoctl against the real daemon).
dpc_test(NAME resources_workers LABEL integration TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/resources_workers.py
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipacoctl> ${CMAKE_SOURCE_DIR}/proto)
# Connection exhaustion under a low open-file limit, handshake and idle timeouts, the
# listener self-check (a restart loop plays systemd).
dpc_test(NAME resources_conn LABEL integration TIMEOUT 180 REQUIRES DISTRIBUTED
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/resources_conn.py
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipacoctl>)
# The memory estimate at job create: over --memory-budget-mb → RESOURCE_EXHAUSTED.
dpc_test(NAME resources_memory LABEL integration TIMEOUT 120 REQUIRES DISTRIBUTED
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/resources_memory.py
                 $<TARGET_FILE:dipaco-coordinator> ${CMAKE_SOURCE_DIR}/proto)
