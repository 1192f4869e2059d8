# Muon, the MuLoCo inner optimizer (docs/design.md §3.2): dipacoctl train --optimizer muon
# against the PyTorch reference tests/oracle/muon_ref.py (tests/integration/ctl_muon.sh).
dpc_test(NAME ctl_muon LABEL oracle TIMEOUT 120
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/ctl_muon.sh $<TARGET_FILE:dipacoctl> ${DPC_PYTHON})
# Sync DiLoCo with Muon through the real daemons, inner.state checkpoint (tests/integration/muloco_dist.sh).
dpc_test(NAME muloco_dist LABEL integration TIMEOUT 400 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/muloco_dist.sh ${DPC_DAEMONS})
# inner.state "checkpoint" with Muon: workers swapped after round 0 resume the slots' Muon
# buffers and export byte-identical to the keep run (tests/integration/checkpoint_e2e.sh).
dpc_test(NAME checkpoint_e2e_muon LABEL integration TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/checkpoint_e2e.sh ${DPC_DAEMONS}
                 [=[, "optimizer": "muon", "muon": {"lr": 0.02, "weight_decay": 0.05}]=])
