# Security of the coordinator, worker and dipacoctl: join/admin tokens, session identity and
# lease ownership (python grpcio against the real daemon), and TLS / mutual TLS with a CA and
# certificates generated at test time by the openssl CLI.
dpc_test(NAME security_auth LABEL integration TIMEOUT 120 REQUIRES DISTRIBUTED
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/security_auth.py
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipacoctl> $<TARGET_FILE:dipaco-worker>
                 ${CMAKE_SOURCE_DIR}/proto)
dpc_test(NAME security_tls LABEL integration TIMEOUT 120 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/security_tls.sh
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipacoctl> $<TARGET_FILE:dipaco-worker>
                 ${CMAKE_SOURCE_DIR}/proto)
