# SparseLoCo end to end (issue 21): sparse deltas with error feedback through real daemons
# against the PyTorch simulation (tests/oracle/sparse_ref.py), with keep and checkpoint inner
# state, sparse pulls, and top-k without error feedback; malformed sparse pushes refused.
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  add_test(NAME sparse_dist COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/sparse_dist.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(sparse_dist PROPERTIES TIMEOUT 300)
endif()
# The PyTorch reference's own codec checks (hand-computed cases, sizes, ties, hooks).
add_test(NAME sparse_ref_selftest COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/sparse_ref.py --self-test)
set_tests_properties(sparse_ref_selftest PROPERTIES TIMEOUT 120)
