# Embeds a file's bytes in a C++ source, at build time and with CMake alone:
#   cmake -DINPUT=page.html -DOUTPUT=page.cc -DHEADER=dir/page.h -DNAMESPACE=a::b
#         -DFUNCTION=page_bytes -P embed_file.cmake
# writes OUTPUT, which defines `std::string_view NAMESPACE::FUNCTION()` (declared in
# HEADER) returning INPUT's bytes exactly. Used through add_custom_command, so the
# source is regenerated whenever INPUT (or this script) changes.
foreach(var INPUT OUTPUT HEADER NAMESPACE FUNCTION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "embed_file.cmake: -D${var}= is missing")
  endif()
endforeach()

file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n_bytes "${n_hex} / 2")
# "3c21..." -> "0x3c,0x21,...", then a line break every 16 bytes to keep lines short.
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# (CMake's regular expressions have no {n}: the 16 are spelled out.)
string(REPEAT "0x[0-9a-f][0-9a-f]," 16 line_of_bytes)
string(REGEX REPLACE "(${line_of_bytes})" "\\1\n    " bytes "${bytes}")
if(n_bytes EQUAL 0)
  set(bytes "0x00")  # an array may not be empty; the view below stays empty
endif()

get_filename_component(input_name "${INPUT}" NAME)
set(content "// Generated at build time by cmake/embed_file.cmake from ${input_name}: edit that file.
#include \"${HEADER}\"

namespace ${NAMESPACE} {
namespace {
constexpr unsigned char kBytes[] = {
    ${bytes}};
}  // namespace

std::string_view ${FUNCTION}() {
  return {reinterpret_cast<const char*>(kBytes), ${n_bytes}};
}

}  // namespace ${NAMESPACE}
")
file(WRITE "${OUTPUT}" "${content}")
