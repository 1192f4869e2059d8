# DiPaCo end to end: routing (dipacoctl route fit / assign), a 2 x 2 job with per-path data
# (data.paths) through a real coordinator and workers, every exported path against the
# PyTorch DiPaCo reference (tests/oracle/dipaco_ref.py).
dpc_test(NAME dipaco_dist LABEL integration TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/dipaco_dist.sh
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
