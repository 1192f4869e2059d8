# Observability: the real Prometheus, promtool and headless Chromium against a coordinator
# running small jobs, and dipacoctl's live views. Their Debian packages come from
# deploy/install_deps.sh --test; a test fails, naming the package, without them. svgchart: the
# charts they draw (common/svgchart.h), parsed back.
add_executable(test_svgchart ${CMAKE_SOURCE_DIR}/tests/unit/test_svgchart.c)
target_link_libraries(test_svgchart PRIVATE dpc_common)
dpc_test(NAME svgchart LABEL unit TIMEOUT 30 COMMAND test_svgchart)
dpc_test(NAME ops_prometheus LABEL ops TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/ops_prometheus.sh ${DPC_DAEMONS})
dpc_test(NAME ops_status_page LABEL ops TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/ops_status_page.sh ${DPC_DAEMONS})
dpc_test(NAME ops_cli LABEL ops TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/ops_cli.sh ${DPC_DAEMONS})
