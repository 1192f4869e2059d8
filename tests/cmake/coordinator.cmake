# Tests of the coordinator core (dpc_coord): job spec, blob store, its memory cache and known inner-state names, SQLite store, outer
# optimizer (unit tests and a PyTorch oracle), the outer steps streamed over blobs (outerio),
# delta norm screen. Each program is tests/unit/<program>.c linked with dpc_coord.
set(DPC_COORD_TEST_PROGRAMS test_jobspec test_store test_store_blobs test_blobs_cache test_blobs_known test_outer test_outerio test_screen
    test_outer_oracle)
if(DIPACO_DISTRIBUTED)
  foreach(t IN LISTS DPC_COORD_TEST_PROGRAMS)
    add_executable(${t} ${CMAKE_SOURCE_DIR}/tests/unit/${t}.c)
    target_link_libraries(${t} PRIVATE dpc_coord)
  endforeach()
  # Benchmark helpers (not tests): tests/bench/outer_step.sh builds and runs outer_bench; the
  # streamed outer step vs a memory pass (tests/bench/dataplane.sh notes) is outerio_bench.
  add_executable(outer_bench EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/tests/bench/outer_bench.c)
  target_link_libraries(outer_bench PRIVATE dpc_coord)
  add_executable(outerio_bench EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/tests/bench/outerio_bench.c)
  target_link_libraries(outerio_bench PRIVATE dpc_coord)
  # tests/bench/s3_write.sh: the blob writer on an S3 store against curl's single PUT.
  add_executable(s3_write_bench EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/tests/bench/s3_write_bench.c)
  target_link_libraries(s3_write_bench PRIVATE dpc_coord)
endif()
dpc_test(NAME coord_jobspec LABEL unit TIMEOUT 60 REQUIRES DISTRIBUTED COMMAND test_jobspec)
dpc_test(NAME coord_store LABEL unit TIMEOUT 60 REQUIRES DISTRIBUTED COMMAND test_store)
dpc_test(NAME coord_store_blobs LABEL unit TIMEOUT 60 REQUIRES DISTRIBUTED COMMAND test_store_blobs)
dpc_test(NAME coord_blobs_cache LABEL unit TIMEOUT 60 REQUIRES DISTRIBUTED COMMAND test_blobs_cache)
dpc_test(NAME coord_blobs_known LABEL unit TIMEOUT 60 REQUIRES DISTRIBUTED COMMAND test_blobs_known)
dpc_test(NAME coord_outer LABEL unit TIMEOUT 60 REQUIRES DISTRIBUTED COMMAND test_outer)
dpc_test(NAME coord_outerio LABEL unit TIMEOUT 60 REQUIRES DISTRIBUTED COMMAND test_outerio)
dpc_test(NAME coord_screen LABEL unit TIMEOUT 60 REQUIRES DISTRIBUTED COMMAND test_screen)
# The oracle helper runs our outer kernels on arrays the Python oracle writes.
dpc_test(NAME coord_outer_oracle LABEL oracle TIMEOUT 120 REQUIRES DISTRIBUTED
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/outer_oracle.py $<TARGET_FILE:test_outer_oracle>)
