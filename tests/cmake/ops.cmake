# Observability (issue 17, part 1): the real Prometheus, promtool and headless Chromium against
# a coordinator running small jobs, and dipacoctl's live views. Each test installs its Debian
# packages (ops_lib.sh) and exits 77 (skipped) with the reason when it cannot. svgchart: the
# charts they draw (common/svgchart.h), parsed back.
add_executable(test_svgchart ${CMAKE_SOURCE_DIR}/tests/unit/test_svgchart.c)
target_link_libraries(test_svgchart PRIVATE dpc_common)
add_test(NAME svgchart COMMAND test_svgchart)
set_tests_properties(svgchart PROPERTIES TIMEOUT 30 LABELS ops)
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  foreach(t prometheus status_page cli)
    add_test(NAME ops_${t} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/ops_${t}.sh
             $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
    set_tests_properties(ops_${t} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS ops)
  endforeach()
endif()
