# The S3 object-store client (coordinator/s3.h): the SigV4 signer against AWS's published
# examples, and the client against a real Ceph RADOS Gateway started on loopback
# (tests/s3/rgw.sh, ~15 s to start).
if(DIPACO_DISTRIBUTED)
  foreach(t test_s3_sigv4 test_s3_store)
    add_executable(${t} ${CMAKE_SOURCE_DIR}/tests/unit/${t}.c)
    target_link_libraries(${t} PRIVATE dpc_coord)
  endforeach()
endif()
dpc_test(NAME s3_sigv4 LABEL unit TIMEOUT 30 REQUIRES DISTRIBUTED COMMAND test_s3_sigv4)
dpc_test(NAME s3_client LABEL integration TIMEOUT 180 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/s3/s3_client.sh $<TARGET_FILE:test_s3_store>)
