# strip_services.cmake — cmake -P script: copy a .proto without its `service` blocks.
# protoc-c turns the method Coordinator.Register into a struct member named `register`, a C
# keyword; the C side needs only the messages (rpc.h spells method paths itself), so the C
# code is generated from this copy while the .proto in the source tree stays complete for
# other languages. Usage: cmake -DIN=a.proto -DOUT=b.proto -P strip_services.cmake
file(READ ${IN} text)
string(REGEX REPLACE "\nservice [A-Za-z0-9_]+ {[^}]*}" "\n" text "${text}")
file(WRITE ${OUT} "${text}")
