# dipacoctl's admin commands (coordinator/ctl/): against a fake Admin server written
# with common/rpc.h (always, with the distributed build), and against the real coordinator
# plus a python grpcio client once dipaco-coordinator exists.
if(TARGET dipacoctl AND TARGET dpc_rpc AND TARGET dpc_coord)
  add_executable(test_ctl_admin_fake ${CMAKE_SOURCE_DIR}/tests/unit/test_ctl_admin_fake.c)
  target_link_libraries(test_ctl_admin_fake PRIVATE dpc_rpc dpc_coord)
  add_test(NAME ctl_admin_fake
           COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/ctl_admin_fake.py
                   $<TARGET_FILE:dipacoctl> $<TARGET_FILE:test_ctl_admin_fake>)
  set_tests_properties(ctl_admin_fake PROPERTIES TIMEOUT 120)
endif()

if(TARGET dipacoctl AND TARGET dipaco-coordinator)
  add_test(NAME ctl_admin_coordinator
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/ctl_admin_coordinator.sh
                   $<TARGET_FILE:dipacoctl> $<TARGET_FILE:dipaco-coordinator>)
  set_tests_properties(ctl_admin_coordinator PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
  add_test(NAME ctl_admin_grpcio
           COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/grpcio_client.py
                   $<TARGET_FILE:dipaco-coordinator> ${CMAKE_SOURCE_DIR}/proto)
  set_tests_properties(ctl_admin_grpcio PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77)
endif()
