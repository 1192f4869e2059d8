# coordinator/coordinator.cmake — the coordinator's core library dpc_coord (no gRPC, no libuv)
# and the daemon dipaco-coordinator (every other coordinator/*.c: RPC handlers, scheduling,
# loop, main). The core library's members are the "core:" line of the map in coord.h, the one
# list (tests/arch/layers.py reads the same line).
# The admin CLI lives in ctl/ and is built from coordinator/CMakeLists.txt.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/coord.h)
file(STRINGS ${CMAKE_CURRENT_SOURCE_DIR}/coord.h _core_line REGEX "^ \\*   core: ")
if(NOT _core_line)
  message(FATAL_ERROR "coordinator/coord.h: no ' *   core: ...' line in its map")
endif()
string(REGEX REPLACE "^ \\*   core: +" "" _core_line "${_core_line}")
string(REPLACE " " ";" _core_mods "${_core_line}")
set(DPC_COORD_CORE)
foreach(_m ${_core_mods})
  file(GLOB _f CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${_m}.c)
  if(NOT _f)
    message(FATAL_ERROR "coordinator/coord.h: the core line names '${_m}', which matches no coordinator/*.c")
  endif()
  list(APPEND DPC_COORD_CORE ${_f})
endforeach()
if(DIPACO_DISTRIBUTED)
  pkg_check_modules(SQLITE3 REQUIRED IMPORTED_TARGET sqlite3)
  pkg_check_modules(LIBCRYPTO REQUIRED IMPORTED_TARGET libcrypto)
  pkg_check_modules(LIBCURL REQUIRED IMPORTED_TARGET libcurl)
  add_library(dpc_coord STATIC ${DPC_COORD_CORE})
  target_link_libraries(dpc_coord PUBLIC dpc_kernels dpc_common PkgConfig::SQLITE3 PkgConfig::LIBCRYPTO
    PkgConfig::LIBCURL OpenMP::OpenMP_C m)
endif()

# The coordinator daemon: every coordinator/*.c that is neither core nor CLI.
if(DIPACO_DISTRIBUTED)
  pkg_check_modules(LIBUV REQUIRED IMPORTED_TARGET libuv)
  pkg_check_modules(LIBSYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
  file(GLOB DPC_COORDD_SRC CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.c)
  list(REMOVE_ITEM DPC_COORDD_SRC ${DPC_COORD_CORE})
  add_executable(dipaco-coordinator ${DPC_COORDD_SRC})
  target_link_libraries(dipaco-coordinator PRIVATE dpc_coord dpc_rpc dpc_kernels dpc_common
    PkgConfig::LIBUV PkgConfig::LIBSYSTEMD PkgConfig::LIBCRYPTO Threads::Threads m)
  install(TARGETS dipaco-coordinator RUNTIME DESTINATION bin)
endif()
