# Fault tolerance (issue 4): the coordinator SIGKILLed at each named crash point
# (coordinator/testhook.h) must lose and double nothing and end byte-identical to a fault-free
# run; tests/chaos/ is the test of record that kills workers and the coordinator at random.
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  foreach(point pull:10 push:10 push-commit:3 push-ack:3 outer:2 gc:2)
    string(REGEX REPLACE ":.*" "" name ${point})
    add_test(NAME coord_crash_${name} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/coord_crash.sh
             $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl> ${point})
    set_tests_properties(coord_crash_${name} PROPERTIES TIMEOUT 300 LABELS fault)
  endforeach()
  # The same for a one-slot diloco-async job (deterministic: no self-inflicted staleness).
  foreach(point push-ack:3 outer:3 gc:2)
    string(REGEX REPLACE ":.*" "" name ${point})
    add_test(NAME coord_crash_async_${name} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/coord_crash.sh
             $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl> ${point} async)
    set_tests_properties(coord_crash_async_${name} PROPERTIES TIMEOUT 300 LABELS fault)
  endforeach()
  add_test(NAME chaos COMMAND bash ${CMAKE_SOURCE_DIR}/tests/chaos/chaos.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(chaos PROPERTIES TIMEOUT 600 LABELS fault)
  add_test(NAME chaos_async COMMAND ${CMAKE_COMMAND} -E env CHAOS_ALGO=async bash ${CMAKE_SOURCE_DIR}/tests/chaos/chaos.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(chaos_async PROPERTIES TIMEOUT 600 LABELS fault)
  add_test(NAME outer_corrupt COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/outer_corrupt.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(outer_corrupt PROPERTIES TIMEOUT 180 LABELS fault)
  add_test(NAME lease_errors COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/lease_errors.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(lease_errors PROPERTIES TIMEOUT 180 LABELS fault)
  # Issue 23: a SIGKILLed worker's slot goes to the spare after a few missed heartbeats, not
  # after the lease TTL, and the result equals the fault-free run.
  add_test(NAME fast_failover COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/fast_failover.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(fast_failover PROPERTIES TIMEOUT 300 LABELS fault)
  # Issue 23: a quorum round closes quorum_grace_s after its quorum, not at its deadline.
  add_test(NAME quorum_grace COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/quorum_grace.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(quorum_grace PROPERTIES TIMEOUT 300 LABELS fault)
  # Issue 23: a worker cut off by the grace window stops at once (Watch lease_ended); a round
  # whose missing slots no connected worker holds closes at its quorum.
  add_test(NAME quorum_early COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/quorum_early.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(quorum_early PROPERTIES TIMEOUT 300 LABELS fault)
  add_test(NAME chaos_streaming COMMAND ${CMAKE_COMMAND} -E env CHAOS_ALGO=streaming bash ${CMAKE_SOURCE_DIR}/tests/chaos/chaos.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(chaos_streaming PROPERTIES TIMEOUT 600 LABELS fault)
  add_test(NAME chaos_sparse COMMAND ${CMAKE_COMMAND} -E env CHAOS_ALGO=sparse bash ${CMAKE_SOURCE_DIR}/tests/chaos/chaos.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(chaos_sparse PROPERTIES TIMEOUT 600 LABELS fault)
endif()
