# The architecture checks (tests/arch/layers.py; the room table is docs/design.md §7): no include
# from a lower room into a higher one, no include cycle between modules, and no two modules of one
# program or library that call each other (read from the object files with nm). The
# self-test plants each kind of violation and requires the checker to catch it.
dpc_test(NAME arch_selftest LABEL arch TIMEOUT 60
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/arch/layers.py self-test)
dpc_test(NAME arch_includes LABEL arch TIMEOUT 60
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/arch/layers.py src ${CMAKE_SOURCE_DIR})
# Every library and program of this configuration (DIPACO_DISTRIBUTED=OFF builds no gRPC
# layer, coordinator or worker daemon); a target missing from the build is a generate error.
set(DPC_ARCH_TARGETS dpc_common dpc_rpc dpc_kernels dpc_coord dipaco-coordinator dpc_trainer dpc_worker dipaco-worker dipacoctl)
if(NOT DIPACO_DISTRIBUTED)
  list(REMOVE_ITEM DPC_ARCH_TARGETS dpc_rpc dpc_coord dipaco-coordinator dpc_worker dipaco-worker)
endif()
if(DPC_HAVE_CUDA) # the CUDA backend's objects: its two model files call the shared product, not each other
  list(APPEND DPC_ARCH_TARGETS dpc_kernels_cuda)
endif()
set(DPC_ARCH_ARGS)
foreach(t IN LISTS DPC_ARCH_TARGETS)
  list(APPEND DPC_ARCH_ARGS "${t}=$<JOIN:$<TARGET_OBJECTS:${t}>,,>")
endforeach()
dpc_test(NAME arch_calls LABEL arch TIMEOUT 60
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/arch/layers.py calls ${DPC_ARCH_ARGS})
# No reference points outside the tree (tests/arch/refs.py): every cited Markdown file, section
# and anchor exists, and product code carries no issue-tracker numbers; the self-test plants each.
dpc_test(NAME arch_refs_selftest LABEL arch TIMEOUT 60
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/arch/refs.py self-test)
dpc_test(NAME arch_refs LABEL arch TIMEOUT 60
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/arch/refs.py check ${CMAKE_SOURCE_DIR})
# Product code stays in pieces a reader can hold (tests/arch/sizes.py): no file over 900 lines, no
# function over 120; the self-test plants one of each.
dpc_test(NAME arch_sizes_selftest LABEL arch TIMEOUT 60
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/arch/sizes.py self-test)
dpc_test(NAME arch_sizes LABEL arch TIMEOUT 60
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/arch/sizes.py check ${CMAKE_SOURCE_DIR})
