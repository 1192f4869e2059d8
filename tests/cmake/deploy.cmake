# Deployment with the real components (tests/deploy/): the coordinator and worker images' root
# file systems run with unshare + chroot, Slurm (slurmctld + slurmd on localhost), the Kubernetes
# manifests (kubectl kustomize + offline schema validation) and the systemd unit (verify,
# security, and the unit run under systemd). They need root and the packages
# deploy/install_deps.sh --test installs; each fails, saying what is missing, without them
# (tests/run.sh -LE deploy leaves them out).
dpc_test(NAME deploy_images LABEL deploy TIMEOUT 180 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/deploy/images.sh
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
dpc_test(NAME deploy_slurm LABEL deploy TIMEOUT 240 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/deploy/slurm.sh
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
dpc_test(NAME deploy_systemd LABEL deploy TIMEOUT 180 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/deploy/systemd_unit.sh
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
dpc_test(NAME deploy_k8s LABEL deploy TIMEOUT 400 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/deploy/k8s.sh
                 $<TARGET_FILE:dipaco-coordinator> $<TARGET_FILE:dipaco-worker> $<TARGET_FILE:dipacoctl>)
# The coordinator's default memory budget from its cgroup (what a systemd MemoryMax= or a
# container limit sets), on fake /proc and /sys/fs/cgroup trees.
add_executable(test_membudget ${CMAKE_SOURCE_DIR}/tests/unit/test_membudget.c ${CMAKE_SOURCE_DIR}/coordinator/membudget.c)
target_link_libraries(test_membudget PRIVATE dpc_common)
dpc_test(NAME deploy_membudget LABEL unit TIMEOUT 30 COMMAND test_membudget)
