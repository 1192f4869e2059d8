# SparseLoCo end to end: sparse deltas with error feedback through real daemons against the
# PyTorch simulation (tests/oracle/sparse_ref.py), with keep and checkpoint inner state, sparse
# pulls, top-k without error feedback, and a DiPaCo job with sparse deltas against
# tests/oracle/dipaco_ref.py.
dpc_test(NAME sparse_dist LABEL integration TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/sparse_dist.sh ${DPC_DAEMONS})
# The PyTorch reference's own codec checks (hand-computed cases, sizes, ties, hooks).
dpc_test(NAME sparse_ref_selftest LABEL oracle TIMEOUT 120
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/sparse_ref.py --self-test)
