# Tests of the file formats and checksums in common/ (checksum, fsutil, safetensors,
# modeldir, shard, dataset) and their PyTorch/numpy interop.
foreach(t checksum fsutil safetensors modeldir shard)
  if(NOT EXISTS ${CMAKE_SOURCE_DIR}/tests/unit/test_formats_${t}.c)
    continue()
  endif()
  add_executable(test_formats_${t} ${CMAKE_SOURCE_DIR}/tests/unit/test_formats_${t}.c)
  target_link_libraries(test_formats_${t} PRIVATE dpc_kernels dpc_common)
  add_test(NAME formats_${t} COMMAND test_formats_${t})
  set_tests_properties(formats_${t} PROPERTIES TIMEOUT 60)
endforeach()

# A small driver the python interop tests call: load/save model dirs, dump batches.
if(NOT EXISTS ${CMAKE_SOURCE_DIR}/tests/unit/test_formats_tool.c)
  return()
endif()
add_executable(formats_tool ${CMAKE_SOURCE_DIR}/tests/unit/test_formats_tool.c)
target_link_libraries(formats_tool PRIVATE dpc_kernels dpc_common)

foreach(t interop dataset)
  add_test(NAME formats_py_${t}
           COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/formats_${t}.py $<TARGET_FILE:formats_tool>)
  set_tests_properties(formats_py_${t} PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
endforeach()
