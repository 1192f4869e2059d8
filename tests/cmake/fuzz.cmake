# tests/cmake/fuzz.cmake — libFuzzer targets for every parser of untrusted input (tests/fuzz/),
# each run for a short bounded time in CI after its kept regression inputs are replayed.
#
# DIPACO_FUZZ (top-level CMakeLists.txt): AUTO builds them when clang with libFuzzer is found,
# ON requires it, OFF builds none and registers the tests as skips that say so. The fuzzers need
# clang whatever compiler this build uses, so they are a separate CMake project
# (tests/fuzz/CMakeLists.txt) built with clang into <build>/fuzz as an ExternalProject, part of
# `cmake --build <build>` (target dipaco_fuzz). AUTO without clang/libFuzzer registers them
# anyway and they fail, saying what to install (deploy/install_deps.sh --test installs it).
# DIPACO_FUZZ_SECONDS: fuzzing time per target (default 10; tests/run.sh -L fuzz selects them,
# -LE fuzz leaves them out).
set(DIPACO_FUZZ_SECONDS 10 CACHE STRING "Seconds each fuzz target runs under ctest")
set(DPC_FUZZ_DIR ${CMAKE_BINARY_DIR}/fuzz)
math(EXPR DPC_FUZZ_TIMEOUT "${DIPACO_FUZZ_SECONDS} + 90")

if(NOT DEFINED DIPACO_FUZZ)
  set(DIPACO_FUZZ AUTO)
endif()

set(dpc_fuzz_missing "")
if(DIPACO_FUZZ STREQUAL "OFF")
  set(DPC_NO_FUZZ "DIPACO_FUZZ=OFF: the fuzz targets are not built")
elseif(NOT DIPACO_DISTRIBUTED)
  set(DPC_NO_FUZZ "DIPACO_DISTRIBUTED=OFF: the fuzz targets need gRPC and protobuf-c")
else()
  if(CMAKE_C_COMPILER_ID MATCHES "Clang")
    set(DPC_FUZZ_CC ${CMAKE_C_COMPILER})
  else()
    find_program(DPC_FUZZ_CC NAMES clang clang-14 clang-15 clang-16 clang-13)
  endif()
  if(NOT DPC_FUZZ_CC)
    set(dpc_fuzz_missing "no clang found (libFuzzer needs it; apt-get install clang libclang-rt-dev)")
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
      set(dpc_fuzz_missing "${DPC_FUZZ_CC} cannot link -fsanitize=fuzzer,address,undefined (${probe_out}); install clang and libclang-rt-dev")
    endif()
  endif()
  if(dpc_fuzz_missing AND DIPACO_FUZZ STREQUAL "ON")
    message(FATAL_ERROR "DIPACO_FUZZ=ON: ${dpc_fuzz_missing}")
  endif()
  file(MAKE_DIRECTORY ${DPC_FUZZ_DIR})
  if(dpc_fuzz_missing)
    message(WARNING "fuzz targets: not built (${dpc_fuzz_missing}); their tests will fail")
    file(WRITE ${DPC_FUZZ_DIR}/NOT_BUILT "${dpc_fuzz_missing}\n")
  else()
    file(REMOVE ${DPC_FUZZ_DIR}/NOT_BUILT)
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
endif()

# fuzz_<x>: tests/fuzz/fuzz_<x>.c (built by tests/fuzz/CMakeLists.txt), seeds in
# tests/fuzz/corpus/<x>/, kept regression inputs in tests/fuzz/regress/<x>/.
set(DPC_FUZZ_RUN bash ${CMAKE_SOURCE_DIR}/tests/fuzz/run_fuzz.sh)
dpc_test(NAME fuzz_safetensors LABEL fuzz TIMEOUT ${DPC_FUZZ_TIMEOUT} REQUIRES FUZZ
         COMMAND ${DPC_FUZZ_RUN} ${DPC_FUZZ_DIR}/fuzz_safetensors safetensors ${DIPACO_FUZZ_SECONDS})
dpc_test(NAME fuzz_shard LABEL fuzz TIMEOUT ${DPC_FUZZ_TIMEOUT} REQUIRES FUZZ
         COMMAND ${DPC_FUZZ_RUN} ${DPC_FUZZ_DIR}/fuzz_shard shard ${DIPACO_FUZZ_SECONDS})
dpc_test(NAME fuzz_modeldir_config LABEL fuzz TIMEOUT ${DPC_FUZZ_TIMEOUT} REQUIRES FUZZ
         COMMAND ${DPC_FUZZ_RUN} ${DPC_FUZZ_DIR}/fuzz_modeldir_config modeldir_config ${DIPACO_FUZZ_SECONDS})
dpc_test(NAME fuzz_modeldir_load LABEL fuzz TIMEOUT ${DPC_FUZZ_TIMEOUT} REQUIRES FUZZ
         COMMAND ${DPC_FUZZ_RUN} ${DPC_FUZZ_DIR}/fuzz_modeldir_load modeldir_load ${DIPACO_FUZZ_SECONDS})
dpc_test(NAME fuzz_jobspec LABEL fuzz TIMEOUT ${DPC_FUZZ_TIMEOUT} REQUIRES FUZZ
         COMMAND ${DPC_FUZZ_RUN} ${DPC_FUZZ_DIR}/fuzz_jobspec jobspec ${DIPACO_FUZZ_SECONDS})
dpc_test(NAME fuzz_tokenizer_files LABEL fuzz TIMEOUT ${DPC_FUZZ_TIMEOUT} REQUIRES FUZZ
         COMMAND ${DPC_FUZZ_RUN} ${DPC_FUZZ_DIR}/fuzz_tokenizer_files tokenizer_files ${DIPACO_FUZZ_SECONDS})
dpc_test(NAME fuzz_tokenizer_roundtrip LABEL fuzz TIMEOUT ${DPC_FUZZ_TIMEOUT} REQUIRES FUZZ
         COMMAND ${DPC_FUZZ_RUN} ${DPC_FUZZ_DIR}/fuzz_tokenizer_roundtrip tokenizer_roundtrip ${DIPACO_FUZZ_SECONDS})
dpc_test(NAME fuzz_tokenizer_json LABEL fuzz TIMEOUT ${DPC_FUZZ_TIMEOUT} REQUIRES FUZZ
         COMMAND ${DPC_FUZZ_RUN} ${DPC_FUZZ_DIR}/fuzz_tokenizer_json tokenizer_json ${DIPACO_FUZZ_SECONDS})
dpc_test(NAME fuzz_chunk LABEL fuzz TIMEOUT ${DPC_FUZZ_TIMEOUT} REQUIRES FUZZ
         COMMAND ${DPC_FUZZ_RUN} ${DPC_FUZZ_DIR}/fuzz_chunk chunk ${DIPACO_FUZZ_SECONDS})
dpc_test(NAME fuzz_proto LABEL fuzz TIMEOUT ${DPC_FUZZ_TIMEOUT} REQUIRES FUZZ
         COMMAND ${DPC_FUZZ_RUN} ${DPC_FUZZ_DIR}/fuzz_proto proto ${DIPACO_FUZZ_SECONDS})
dpc_test(NAME fuzz_codec LABEL fuzz TIMEOUT ${DPC_FUZZ_TIMEOUT} REQUIRES FUZZ
         COMMAND ${DPC_FUZZ_RUN} ${DPC_FUZZ_DIR}/fuzz_codec codec ${DIPACO_FUZZ_SECONDS})
dpc_test(NAME fuzz_sparse LABEL fuzz TIMEOUT ${DPC_FUZZ_TIMEOUT} REQUIRES FUZZ
         COMMAND ${DPC_FUZZ_RUN} ${DPC_FUZZ_DIR}/fuzz_sparse sparse ${DIPACO_FUZZ_SECONDS})

# Every tests/fuzz/fuzz_<x>.c has its test above, and every test above its source.
file(GLOB _dpc_fuzz_srcs RELATIVE ${CMAKE_SOURCE_DIR}/tests/fuzz CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_*.c)
string(REGEX REPLACE "\\.c(;|$)" "\\1" _dpc_fuzz_srcs "${_dpc_fuzz_srcs}")
get_property(_dpc_fuzz_tests GLOBAL PROPERTY DPC_REGISTERED_TESTS)
list(FILTER _dpc_fuzz_tests INCLUDE REGEX "^fuzz_")
list(SORT _dpc_fuzz_srcs)
list(SORT _dpc_fuzz_tests)
if(NOT _dpc_fuzz_srcs STREQUAL _dpc_fuzz_tests)
  message(FATAL_ERROR "tests/cmake/fuzz.cmake registers ${_dpc_fuzz_tests}, but tests/fuzz/ holds ${_dpc_fuzz_srcs}: one test per fuzz_*.c")
endif()
