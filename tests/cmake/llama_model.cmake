# The Llama family end to end in the training core: the CPU backend's whole-model forward,
# backward and AdamW against PyTorch (tests/oracle/llama_oracle.py; torch missing is a
# failure), its layout, config checks and init (tests/unit/test_llama_layout.c), and Hugging Face
# model directories in and out (tests/unit/test_llama_modeldir.c).
add_executable(test_llama_oracle ${CMAKE_SOURCE_DIR}/tests/unit/test_llama_oracle.c)
target_link_libraries(test_llama_oracle PRIVATE dpc_kernels dpc_common)
add_test(NAME llama_oracle COMMAND test_llama_oracle ${CMAKE_SOURCE_DIR}/tests/oracle/llama_oracle.py ${DPC_PYTHON})
set_tests_properties(llama_oracle PROPERTIES TIMEOUT 120 LABELS oracle)

add_executable(test_llama_modeldir ${CMAKE_SOURCE_DIR}/tests/unit/test_llama_modeldir.c)
target_link_libraries(test_llama_modeldir PRIVATE dpc_kernels dpc_common)
add_test(NAME llama_modeldir COMMAND test_llama_modeldir)
set_tests_properties(llama_modeldir PROPERTIES TIMEOUT 60)

# dipacoctl init/train/eval/generate with a Llama model, and its export read by the PyTorch
# module of tests/oracle/llama_oracle.py (tests/integration/ctl_llama.sh).
if(TARGET dipacoctl)
  add_test(NAME ctl_llama COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/ctl_llama.sh $<TARGET_FILE:dipacoctl> ${DPC_PYTHON})
  set_tests_properties(ctl_llama PROPERTIES TIMEOUT 300 LABELS oracle)
endif()

add_executable(test_llama_layout ${CMAKE_SOURCE_DIR}/tests/unit/test_llama_layout.c)
target_link_libraries(test_llama_layout PRIVATE dpc_kernels dpc_common)
add_test(NAME llama_layout COMMAND test_llama_layout)
set_tests_properties(llama_layout PROPERTIES TIMEOUT 60)
