# Llama-class jobs through the real daemons (a coordinator and 2 CPU workers on loopback), each
# against the matching PyTorch reference running tests/oracle/llama_oracle.py's module: sync DiLoCo
# with a GQA, tied model whose spec gives the shape and a seed (tests/integration/llama_diloco_dist.sh),
# and a downloaded-style BF16 sharded HF checkpoint as model.init, one round, exported under HF's
# names and config keys (tests/integration/llama_checkpoint.sh); and DiPaCo with levels over the
# Llama layers after routing on model.norm's features (tests/integration/llama_dipaco_dist.sh); and
# Streaming DiLoCo fragments over an untied Llama (tests/integration/llama_streaming_dist.sh).
dpc_test(NAME integration_llama_diloco LABEL integration TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/llama_diloco_dist.sh ${DPC_DAEMONS})
dpc_test(NAME integration_llama_checkpoint LABEL integration TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/llama_checkpoint.sh ${DPC_DAEMONS})
dpc_test(NAME integration_llama_dipaco LABEL integration TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/llama_dipaco_dist.sh ${DPC_DAEMONS})
dpc_test(NAME integration_llama_streaming LABEL integration TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/llama_streaming_dist.sh ${DPC_DAEMONS})
# SparseLoCo and int8 deltas with a Llama (tests/integration/llama_codecs_dist.sh).
dpc_test(NAME integration_llama_codecs LABEL integration TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/llama_codecs_dist.sh ${DPC_DAEMONS})
# Asynchronous DiLoCo (delayed Nesterov) with a Llama, its ledger replayed
# (tests/integration/llama_async_dist.sh).
dpc_test(NAME integration_llama_async LABEL integration TIMEOUT 300 REQUIRES DISTRIBUTED
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/llama_async_dist.sh ${DPC_DAEMONS})
