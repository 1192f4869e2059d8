# docs/jobspec.md is generated from the job spec's field table (coordinator/jobspec_fields.c)
# by the helper jobspec_doc (tests/unit/jobspec_doc.c). `cmake --build BUILD --target
# jobspec-doc` rewrites the checked-in file; the test jobspec_doc regenerates it into the build
# tree and fails, printing the diff, when the checked-in file is stale.
if(DIPACO_DISTRIBUTED)
  add_executable(jobspec_doc ${CMAKE_SOURCE_DIR}/tests/unit/jobspec_doc.c)
  target_link_libraries(jobspec_doc PRIVATE dpc_coord)
  add_custom_target(jobspec-doc
    COMMAND jobspec_doc ${CMAKE_SOURCE_DIR}/docs/jobspec.md
    COMMENT "Writing docs/jobspec.md from the job spec's field table")
endif()
dpc_test(NAME jobspec_doc LABEL unit TIMEOUT 60 REQUIRES DISTRIBUTED
         COMMAND sh -c "\"$0\" \"$2\" && diff -u \"$1\" \"$2\" || { echo \"docs/jobspec.md is stale: regenerate it with 'cmake --build <build dir> --target jobspec-doc' and commit it\"; exit 1; }"
                 $<TARGET_FILE:jobspec_doc> ${CMAKE_SOURCE_DIR}/docs/jobspec.md ${CMAKE_CURRENT_BINARY_DIR}/jobspec.md)
