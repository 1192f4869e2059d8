# Tokenizer tests (common/tokenizer.c). The GPT-2 files and the npm oracle come from
# deploy/fetch_assets.sh tests/.cache (tests/run.sh runs it); a test whose files are missing
# fails, saying to run it.
set(DPC_TOK_CACHE ${CMAKE_SOURCE_DIR}/tests/.cache)

add_executable(test_tokenizer ${CMAKE_SOURCE_DIR}/tests/unit/test_tokenizer.c)
target_link_libraries(test_tokenizer PRIVATE dpc_common)
add_executable(test_tokenizer_tool ${CMAKE_SOURCE_DIR}/tests/unit/test_tokenizer_tool.c)
target_link_libraries(test_tokenizer_tool PRIVATE dpc_common)

# Byte tokenizer, BPE against a naive loop on a generated vocabulary, malformed files.
dpc_test(NAME tokenizer_unit LABEL unit TIMEOUT 120 COMMAND test_tokenizer)
# GPT-2: known encodings, round trips of random UTF-8 / random bytes, long pieces.
dpc_test(NAME tokenizer_gpt2 LABEL unit TIMEOUT 120 COMMAND test_tokenizer ${DPC_TOK_CACHE}/gpt2)
# Ids identical to the npm gpt-3-encoder (JavaScript) on a generated corpus plus SOTU text.
dpc_test(NAME tokenizer_oracle LABEL oracle TIMEOUT 120
         COMMAND ${DPC_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/tokenizer_oracle.py
                 --tool $<TARGET_FILE:test_tokenizer_tool> --cache ${DPC_TOK_CACHE})
# 1 MB of SOTU encoded as one text: decode gives it back; prints MB/s.
dpc_test(NAME tokenizer_corpus LABEL unit TIMEOUT 120
         COMMAND sh -c "\"$0\" bench \"$1\" 1000000 \"$2\"/*.txt"
                 $<TARGET_FILE:test_tokenizer_tool> ${DPC_TOK_CACHE}/gpt2 ${DPC_TOK_CACHE}/sotu)
