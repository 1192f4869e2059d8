# Streaming DiLoCo end to end: F = 2 with overlap and merge against the PyTorch simulation
# (tests/oracle/streaming_ref.py), e3m0 deltas with inner.state checkpoint, and F = 1 equal to
# plain DiLoCo byte for byte.
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  add_test(NAME streaming_dist COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/streaming_dist.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(streaming_dist PROPERTIES TIMEOUT 300)
endif()
