# Security of the coordinator, worker and dipacoctl: join/admin tokens, session identity and
# lease ownership (python grpcio against the real daemon), and TLS / mutual TLS with a CA and
# certificates generated at test time by the openssl CLI.
if(TARGET dipaco-coordinator AND TARGET dipacoctl AND TARGET dipaco-worker)
  add_test(NAME security_auth
           COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/security_auth.py
                   $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipacoctl> $<TARGET_FILE:dipaco-worker>
                   ${CMAKE_SOURCE_DIR}/proto)
  set_tests_properties(security_auth PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
  add_test(NAME security_tls
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/security_tls.sh
                   $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipacoctl> $<TARGET_FILE:dipaco-worker>
                   ${CMAKE_SOURCE_DIR}/proto)
  set_tests_properties(security_tls PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
