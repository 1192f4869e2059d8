# The S3 object store: the SigV4 signer against AWS's published examples; the client
# (coordinator/s3.h) and the blob store on S3 (coordinator/blobs_s3.h) against a real Ceph RADOS
# Gateway started on loopback (tests/s3/rgw.sh).
if(DIPACO_DISTRIBUTED)
  foreach(t test_s3_sigv4 test_s3_store test_blobs_s3)
    add_executable(${t} ${CMAKE_SOURCE_DIR}/tests/unit/${t}.c)
    target_link_libraries(${t} PRIVATE dpc_coord)
  endforeach()
  # The worker's reads and part puts through presigned URLs are checked against the same gateway.
  target_sources(test_blobs_s3 PRIVATE ${CMAKE_SOURCE_DIR}/worker/storeget.c ${CMAKE_SOURCE_DIR}/worker/storeput.c)
endif()
dpc_test(NAME s3_sigv4 LABEL unit TIMEOUT 30 REQUIRES DISTRIBUTED COMMAND test_s3_sigv4)
# One gateway for both programs (it takes ~15 s to start).
dpc_test(NAME s3_store LABEL integration TIMEOUT 240 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/s3/with_rgw.sh
                 bash -c "$<TARGET_FILE:test_s3_store> && $<TARGET_FILE:test_blobs_s3>")
# Jobs on the S3 store export byte-identical to the same jobs on the local store; the
# coordinator refuses a bad S3 configuration at start-up with the reason.
dpc_test(NAME s3_jobs LABEL integration TIMEOUT 400 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/s3/with_rgw.sh
                 bash ${CMAKE_SOURCE_DIR}/tests/s3/jobs_s3.sh ${DPC_DAEMONS})
# The chaos test of record on the S3 store: worker, coordinator and gateway SIGKILLs.
dpc_test(NAME chaos_s3 LABEL fault TIMEOUT 600 REQUIRES DISTRIBUTED ENVIRONMENT CHAOS_STORE=s3
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/s3/with_rgw.sh
                 bash ${CMAKE_SOURCE_DIR}/tests/chaos/chaos.sh ${DPC_DAEMONS})
# Workers' delta objects: PrepareDeltaPut, the presigned PUT and the commit's checks, driven by
# python grpcio against a coordinator on the gateway.
dpc_test(NAME s3_put_delta LABEL integration TIMEOUT 180 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/s3/with_rgw.sh
                 ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/s3/put_delta.py $<TARGET_FILE:dipaco-coordinator>
                 ${CMAKE_SOURCE_DIR}/proto)
# Workers' inner-state objects: the prepare's checks, the commit's copy to the slot's name, a
# zombie's late PUT, a restart between prepare and commit.
dpc_test(NAME s3_put_inner LABEL integration TIMEOUT 120 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/s3/with_rgw.sh
                 ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/s3/put_inner.py $<TARGET_FILE:dipaco-coordinator>
                 ${CMAKE_SOURCE_DIR}/proto)
# Coordinator SIGKILLs at crash points on the S3 store (tests/integration/coord_crash.sh): after a
# put delta was checked and before its row (the orphan object swept, the worker's commit refused
# after the restart and its bytes pushed instead), in the middle of an outer step, and after a
# version's commit with its momentum not yet stored (made again at the restart).
dpc_test(NAME coord_crash_s3_push-commit LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED ENVIRONMENT CRASH_STORE=s3
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/s3/with_rgw.sh
                 bash ${CMAKE_SOURCE_DIR}/tests/integration/coord_crash.sh ${DPC_DAEMONS} push-commit:3)
dpc_test(NAME coord_crash_s3_outer LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED ENVIRONMENT CRASH_STORE=s3
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/s3/with_rgw.sh
                 bash ${CMAKE_SOURCE_DIR}/tests/integration/coord_crash.sh ${DPC_DAEMONS} outer:2)
dpc_test(NAME coord_crash_s3_outer-momentum LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED ENVIRONMENT CRASH_STORE=s3
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/s3/with_rgw.sh
                 bash ${CMAKE_SOURCE_DIR}/tests/integration/coord_crash.sh ${DPC_DAEMONS} outer-momentum:2)
# The faults of a real store (503, 429, dropped connections, a PUT stored but answered 500),
# injected by a proxy in front of the gateway (tests/s3/faultproxy.py): retries and fallbacks
# keep the job byte-identical to its local run, the ledger clean.
dpc_test(NAME faults_s3 LABEL fault TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/s3/with_rgw.sh
                 bash ${CMAKE_SOURCE_DIR}/tests/s3/faults_s3.sh ${DPC_DAEMONS})
# A delta, a version and its momentum corrupted or removed on the gateway behind the
# coordinator's back (tests/integration/outer_corrupt.sh with CORRUPT_STORE=s3): the outer step
# pauses the job naming the checksum; start-up makes a version again, or pauses with the reason.
dpc_test(NAME outer_corrupt_s3 LABEL fault TIMEOUT 240 REQUIRES DISTRIBUTED ENVIRONMENT CORRUPT_STORE=s3
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/s3/with_rgw.sh
                 bash ${CMAKE_SOURCE_DIR}/tests/integration/outer_corrupt.sh ${DPC_DAEMONS})
