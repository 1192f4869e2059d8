# Deployment with the real components (tests/deploy/): the coordinator and worker images' root
# file systems run with unshare + chroot, Slurm (slurmctld + slurmd on localhost), the Kubernetes manifests
# (kubectl kustomize + offline schema validation) and the systemd unit (verify, security, and
# the unit run under systemd). Each installs its Debian packages when missing and exits 77
# (skipped), printing why, when it cannot get them or is not root.
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  add_test(NAME deploy_images COMMAND bash ${CMAKE_SOURCE_DIR}/tests/deploy/images.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(deploy_images PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77 LABELS deploy)
endif()
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  add_test(NAME deploy_slurm COMMAND bash ${CMAKE_SOURCE_DIR}/tests/deploy/slurm.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(deploy_slurm PROPERTIES TIMEOUT 240 SKIP_RETURN_CODE 77 LABELS deploy)
endif()
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  add_test(NAME deploy_systemd COMMAND bash ${CMAKE_SOURCE_DIR}/tests/deploy/systemd_unit.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(deploy_systemd PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77 LABELS deploy)
endif()
if(TARGET dipaco-coordinator AND TARGET dipaco-worker AND TARGET dipacoctl)
  add_test(NAME deploy_k8s COMMAND bash ${CMAKE_SOURCE_DIR}/tests/deploy/k8s.sh
           $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
  set_tests_properties(deploy_k8s PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77 LABELS deploy)
endif()
# The coordinator's default memory budget from its cgroup (what a systemd MemoryMax= or a
# container limit sets), on fake /proc and /sys/fs/cgroup trees.
if(TARGET dipaco-coordinator)
  add_executable(test_membudget ${CMAKE_SOURCE_DIR}/tests/unit/test_membudget.c ${CMAKE_SOURCE_DIR}/coordinator/membudget.c)
  target_link_libraries(test_membudget PRIVATE dpc_common)
  add_test(NAME deploy_membudget COMMAND test_membudget)
  set_tests_properties(deploy_membudget PROPERTIES TIMEOUT 30 LABELS deploy)
endif()
