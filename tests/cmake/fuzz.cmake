# tests/cmake/fuzz.cmake — libFuzzer targets for every parser of untrusted input (tests/fuzz/),
# each run for a short bounded time in CI after its kept regression inputs are replayed.
#
# DIPACO_FUZZ (top-level CMakeLists.txt): AUTO builds them when clang with libFuzzer is found,
# ON requires it, OFF registers nothing. The fuzzers need clang whatever compiler this build
# uses, so they are a separate CMake project (tests/fuzz/CMakeLists.txt) built with clang into
# <build>/fuzz as an ExternalProject, part of `cmake --build <build>` (target dipaco_fuzz).
# Without clang/libFuzzer (AUTO) the tests are registered anyway and skip (77), saying why.
# DIPACO_FUZZ_SECONDS: fuzzing time per target (default 10; ctest -L fuzz selects them,
# ctest -LE fuzz leaves them out).
set(DIPACO_FUZZ_SECONDS 10 CACHE STRING "Seconds each fuzz target runs under ctest")
set(DPC_FUZZ_TARGETS safetensors shard modeldir_config modeldir_load jobspec tokenizer_files tokenizer_roundtrip tokenizer_json chunk proto codec sparse)
set(DPC_FUZZ_DIR ${CMAKE_BINARY_DIR}/fuzz)

if(NOT DEFINED DIPACO_FUZZ)
  set(DIPACO_FUZZ AUTO)
endif()

if(NOT DIPACO_FUZZ STREQUAL "OFF")
  set(dpc_fuzz_skip "")
  if(NOT DIPACO_DISTRIBUTED)
    set(dpc_fuzz_skip "DIPACO_DISTRIBUTED=OFF: the fuzz targets need gRPC and protobuf-c")
  else()
    if(CMAKE_C_COMPILER_ID MATCHES "Clang")
      set(DPC_FUZZ_CC ${CMAKE_C_COMPILER})
    else()
      find_program(DPC_FUZZ_CC NAMES clang clang-14 clang-15 clang-16 clang-13)
    endif()
    if(NOT DPC_FUZZ_CC)
      set(dpc_fuzz_skip "no clang found (libFuzzer needs it; apt-get install clang)")
    else()
      # libFuzzer + ASan + UBSan runtimes present? (Debian: libclang-rt-NN-dev)
      set(probe ${CMAKE_BINARY_DIR}/fuzz-probe)
      file(MAKE_DIRECTORY ${probe})
      file(WRITE ${probe}/probe.c
        "#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
      execute_process(COMMAND ${DPC_FUZZ_CC} -fsanitize=fuzzer,address,undefined ${probe}/probe.c -o ${probe}/probe
        RESULT_VARIABLE probe_rc OUTPUT_VARIABLE probe_out ERROR_VARIABLE probe_out)
      if(NOT probe_rc EQUAL 0)
        string(REGEX REPLACE "\n.*" "" probe_out "${probe_out}")
        set(dpc_fuzz_skip "${DPC_FUZZ_CC} cannot link -fsanitize=fuzzer,address,undefined (${probe_out}); install clang and libclang-rt-dev")
      endif()
    endif()
  endif()

  if(dpc_fuzz_skip AND DIPACO_FUZZ STREQUAL "ON")
    message(FATAL_ERROR "DIPACO_FUZZ=ON: ${dpc_fuzz_skip}")
  endif()
  file(MAKE_DIRECTORY ${DPC_FUZZ_DIR})
  if(dpc_fuzz_skip)
    message(STATUS "fuzz targets: not built (${dpc_fuzz_skip}); their tests will skip")
    file(WRITE ${DPC_FUZZ_DIR}/SKIP_REASON "${dpc_fuzz_skip}\n")
  else()
    file(REMOVE ${DPC_FUZZ_DIR}/SKIP_REASON)
    message(STATUS "fuzz targets: built with ${DPC_FUZZ_CC} into ${DPC_FUZZ_DIR}")
    include(ExternalProject)
    ExternalProject_Add(dipaco_fuzz
      SOURCE_DIR ${CMAKE_SOURCE_DIR}/tests/fuzz
      BINARY_DIR ${DPC_FUZZ_DIR}
      CMAKE_ARGS -DCMAKE_C_COMPILER=${DPC_FUZZ_CC} -DCMAKE_BUILD_TYPE=Debug
      INSTALL_COMMAND ""
      BUILD_ALWAYS ON
      USES_TERMINAL_BUILD OFF)
  endif()

  foreach(t ${DPC_FUZZ_TARGETS})
    add_test(NAME fuzz_${t}
      COMMAND bash ${CMAKE_SOURCE_DIR}/tests/fuzz/run_fuzz.sh ${DPC_FUZZ_DIR}/fuzz_${t} ${t} ${DIPACO_FUZZ_SECONDS})
    math(EXPR dpc_fuzz_timeout "${DIPACO_FUZZ_SECONDS} + 90")
    set_tests_properties(fuzz_${t} PROPERTIES TIMEOUT ${dpc_fuzz_timeout} SKIP_RETURN_CODE 77 LABELS fuzz)
  endforeach()
endif()
