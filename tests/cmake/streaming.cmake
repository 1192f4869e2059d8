# Streaming DiLoCo end to end: F = 2 with overlap and merge against the PyTorch simulation
# (tests/oracle/streaming_ref.py), e3m0 deltas with inner.state checkpoint, and F = 1 equal to
# plain DiLoCo byte for byte.
dpc_test(NAME streaming_dist LABEL integration TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/streaming_dist.sh ${DPC_DAEMONS})
