# Writes OUT, a C++ file defining `const char* const NAME` (in namespace NS) as the text of IN,
# so a file such as the server's chat page is part of the binary (no file to install).
file(READ ${IN} TEXT)
string(FIND "${TEXT}" ")toy_embed\"" CLASH)
if(NOT CLASH EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter )toy_embed\"")
endif()
file(WRITE ${OUT}.tmp "// Generated from ${IN} by cmake/embed_text.cmake; do not edit.\nnamespace ${NS} {\nextern const char* const ${NAME};\nconst char* const ${NAME} = R\"toy_embed(${TEXT})toy_embed\";\n}\n")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
