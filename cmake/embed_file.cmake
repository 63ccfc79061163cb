# Generates a C++ source defining `const unsigned char NAME[]` and
# `const std::size_t NAME_size` with the bytes of INPUT.
# Usage: cmake -DINPUT=... -DOUTPUT=... -DNAME=... -P embed_file.cmake
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR size "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUTPUT}" "// Generated from ${INPUT}; do not edit.\n#include <cstddef>\nnamespace woq {\nextern const unsigned char ${NAME}[] = {${bytes}};\nextern const std::size_t ${NAME}_size = ${size};\n}  // namespace woq\n")
