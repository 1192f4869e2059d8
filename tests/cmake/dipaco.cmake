# DiPaCo end to end: routing (dipacoctl route fit / assign), a 2 x 2 job with per-path data
# (data.paths) through a real coordinator and workers, every exported path against the
# PyTorch DiPaCo reference (tests/oracle/dipaco_ref.py).
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  add_test(NAME dipaco_dist COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/dipaco_dist.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(dipaco_dist PROPERTIES TIMEOUT 300)
endif()
