# Tests of the coordinator core (dpc_coord): job spec, blob store, SQLite store, outer
# optimizer (unit tests and a PyTorch oracle), the outer steps streamed over blobs (outerio),
# delta norm screen.
if(TARGET dpc_coord)
  foreach(t test_jobspec test_store test_store_blobs test_outer test_outerio test_screen)
    if(EXISTS ${CMAKE_SOURCE_DIR}/tests/unit/${t}.c)
      add_executable(${t} ${CMAKE_SOURCE_DIR}/tests/unit/${t}.c)
      target_link_libraries(${t} PRIVATE dpc_coord)
      string(REPLACE "test_" "" _name ${t})
      add_test(NAME coord_${_name} COMMAND ${t})
      set_tests_properties(coord_${_name} PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77)
    endif()
  endforeach()
  # The oracle helper runs our outer kernels on arrays the Python oracle writes.
  if(EXISTS ${CMAKE_SOURCE_DIR}/tests/unit/test_outer_oracle.c)
    add_executable(test_outer_oracle ${CMAKE_SOURCE_DIR}/tests/unit/test_outer_oracle.c)
    target_link_libraries(test_outer_oracle PRIVATE dpc_coord)
    add_test(NAME coord_outer_oracle
             COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/outer_oracle.py $<TARGET_FILE:test_outer_oracle>)
    set_tests_properties(coord_outer_oracle PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
  endif()
endif()
# Benchmark helper (not a test): tests/bench/outer_step.sh builds and runs it.
if(TARGET dpc_coord AND EXISTS ${CMAKE_SOURCE_DIR}/tests/bench/outer_bench.c)
  add_executable(outer_bench EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/tests/bench/outer_bench.c)
  target_link_libraries(outer_bench PRIVATE dpc_coord)
endif()
# Benchmark helper (not a test): the streamed outer step vs a memory pass (tests/bench/dataplane.sh notes).
if(TARGET dpc_coord AND EXISTS ${CMAKE_SOURCE_DIR}/tests/bench/outerio_bench.c)
  add_executable(outerio_bench EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/tests/bench/outerio_bench.c)
  target_link_libraries(outerio_bench PRIVATE dpc_coord)
endif()
