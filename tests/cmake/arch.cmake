# The architecture checks (tests/arch/layers.py, README "Architecture"): no include from a
# lower room into a higher one, no include cycle between modules, and no two modules of one
# program or library that call each other (read from the object files with nm). The
# self-test plants each kind of violation and requires the checker to catch it.
add_test(NAME arch_selftest COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/arch/layers.py self-test)
add_test(NAME arch_includes COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/arch/layers.py src ${CMAKE_SOURCE_DIR})
set(DPC_ARCH_TARGETS)
foreach(t dpc_common dpc_rpc dpc_kernels dpc_coord dipaco-coordinator dpc_trainer dpc_worker dipaco-worker dipacoctl)
  if(TARGET ${t})
    list(APPEND DPC_ARCH_TARGETS "${t}=$<JOIN:$<TARGET_OBJECTS:${t}>,,>")
  endif()
endforeach()
add_test(NAME arch_calls COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/arch/layers.py calls ${DPC_ARCH_TARGETS})
set_tests_properties(arch_selftest arch_includes arch_calls PROPERTIES TIMEOUT 60 LABELS arch)
