# dipacoctl's admin commands (coordinator/ctl/): against a fake Admin server written
# with common/rpc.h, and against the real coordinator plus a python grpcio client.
if(DIPACO_DISTRIBUTED)
  add_executable(test_ctl_admin_fake ${CMAKE_SOURCE_DIR}/tests/unit/test_ctl_admin_fake.c)
  target_link_libraries(test_ctl_admin_fake PRIVATE dpc_rpc dpc_coord)
endif()
dpc_test(NAME ctl_admin_fake LABEL integration TIMEOUT 120 REQUIRES DISTRIBUTED
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/integration/ctl_admin_fake.py
                 $<TARGET_FILE:dipacoctl> $<TARGET_FILE:test_ctl_admin_fake>)
dpc_test(NAME ctl_admin_coordinator LABEL integration TIMEOUT 120 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/ctl_admin_coordinator.sh
                 $<TARGET_FILE:dipacoctl> $<TARGET_FILE:dipaco-coordinator>)
dpc_test(NAME ctl_admin_grpcio LABEL oracle TIMEOUT 60 REQUIRES DISTRIBUTED
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/grpcio_client.py
                 $<TARGET_FILE:dipaco-coordinator> ${CMAKE_SOURCE_DIR}/proto)
