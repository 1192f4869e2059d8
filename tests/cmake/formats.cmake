# Tests of the file formats and checksums in common/ (checksum, fsutil, safetensors,
# modeldir, shard, dataset) and their PyTorch/numpy interop. Program test_formats_<x> is
# tests/unit/test_formats_<x>.c.
foreach(t checksum fsutil safetensors modeldir shard)
  add_executable(test_formats_${t} ${CMAKE_SOURCE_DIR}/tests/unit/test_formats_${t}.c)
  target_link_libraries(test_formats_${t} PRIVATE dpc_kernels dpc_common)
endforeach()
dpc_test(NAME formats_checksum LABEL unit TIMEOUT 60 COMMAND test_formats_checksum)
dpc_test(NAME formats_fsutil LABEL unit TIMEOUT 60 COMMAND test_formats_fsutil)
dpc_test(NAME formats_safetensors LABEL unit TIMEOUT 60 COMMAND test_formats_safetensors)
dpc_test(NAME formats_modeldir LABEL unit TIMEOUT 60 COMMAND test_formats_modeldir)
dpc_test(NAME formats_shard LABEL unit TIMEOUT 60 COMMAND test_formats_shard)

# A small driver the python interop tests call: load/save model dirs, dump batches.
add_executable(formats_tool ${CMAKE_SOURCE_DIR}/tests/unit/test_formats_tool.c)
target_link_libraries(formats_tool PRIVATE dpc_kernels dpc_common)
dpc_test(NAME formats_py_interop LABEL oracle TIMEOUT 120
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/formats_interop.py $<TARGET_FILE:formats_tool>)
dpc_test(NAME formats_py_dataset LABEL oracle TIMEOUT 120
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/formats_dataset.py $<TARGET_FILE:formats_tool>)
