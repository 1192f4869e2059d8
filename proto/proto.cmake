# proto/proto.cmake — generated protobuf-c code for the wire API (library dpc_proto) and the
# gRPC call layer (library dpc_rpc, from ${DPC_RPC_SRC} = common/rpc*.c). Included from
# common/CMakeLists.txt when DIPACO_DISTRIBUTED is on.
#
# C is generated from a copy without the service blocks (see strip_services.cmake).
# Generated files go to ${CMAKE_BINARY_DIR}/proto/ and are included as
# "proto/dipaco.pb-c.h" and "proto/health.pb-c.h" (the build dir is on the include path of
# everything that links dpc_proto).
find_program(DPC_PROTOC_C NAMES protoc-c REQUIRED)
pkg_check_modules(PROTOBUFC REQUIRED IMPORTED_TARGET libprotobuf-c)
pkg_check_modules(GRPC REQUIRED IMPORTED_TARGET grpc gpr)

set(DPC_PROTO_DIR ${CMAKE_SOURCE_DIR}/proto)
set(DPC_PROTO_OUT ${CMAKE_BINARY_DIR}/proto)
set(DPC_PROTO_SRCS)
foreach(name dipaco health)
  add_custom_command(
    OUTPUT ${DPC_PROTO_OUT}/${name}.pb-c.c ${DPC_PROTO_OUT}/${name}.pb-c.h
    COMMAND ${CMAKE_COMMAND} -E make_directory ${DPC_PROTO_OUT}/src
    COMMAND ${CMAKE_COMMAND} -DIN=${DPC_PROTO_DIR}/${name}.proto
            -DOUT=${DPC_PROTO_OUT}/src/${name}.proto -P ${DPC_PROTO_DIR}/strip_services.cmake
    COMMAND ${DPC_PROTOC_C} --c_out=${DPC_PROTO_OUT} -I${DPC_PROTO_OUT}/src
            ${DPC_PROTO_OUT}/src/${name}.proto
    DEPENDS ${DPC_PROTO_DIR}/${name}.proto ${DPC_PROTO_DIR}/strip_services.cmake
    COMMENT "protoc-c ${name}.proto (messages only)"
    VERBATIM)
  list(APPEND DPC_PROTO_SRCS ${DPC_PROTO_OUT}/${name}.pb-c.c)
endforeach()

add_library(dpc_proto STATIC ${DPC_PROTO_SRCS})
# Generated code includes "dipaco.pb-c.h" by bare name; users include "proto/dipaco.pb-c.h".
target_include_directories(dpc_proto PUBLIC ${CMAKE_BINARY_DIR} ${DPC_PROTO_OUT})
# protoc-c output is not warning-clean under -Wextra (unused parameters in service stubs).
target_compile_options(dpc_proto PRIVATE -Wno-unused-parameter)
target_link_libraries(dpc_proto PUBLIC PkgConfig::PROTOBUFC)

add_library(dpc_rpc STATIC ${DPC_RPC_SRC})
target_link_libraries(dpc_rpc PUBLIC dpc_proto dpc_common PkgConfig::GRPC Threads::Threads)
