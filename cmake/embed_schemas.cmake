# Writes OUTPUT, a C++ file that maps each schema file to its text. A schema is named by
# its path under BASE without `.json`: schemas/envelope.json is `envelope`,
# schemas/frames/server/offer.json is `frames/server/offer`.
# Called at build time: cmake -DOUTPUT=... -DBASE=.../schemas -DINPUTS=a.json;b.json -P embed_schemas.cmake
if(NOT BASE)
  message(FATAL_ERROR "embed_schemas.cmake needs -DBASE=<the schemas folder>")
endif()
set(body "// Generated from schemas/**/*.json by cmake/embed_schemas.cmake. Do not edit.\n")
string(APPEND body "#include \"amp/detail/embedded_schemas.hpp\"\n\nnamespace amp::detail {\n")
string(APPEND body "const std::vector<embedded_schema>& embedded_schemas() {\n")
string(APPEND body "  static const std::vector<embedded_schema> all{\n")
list(SORT INPUTS)  # in name order (all share BASE), whatever order the glob gave
foreach(input IN LISTS INPUTS)
  file(RELATIVE_PATH relative ${BASE} ${input})
  if(NOT relative MATCHES "^[A-Za-z0-9_][A-Za-z0-9_./-]*\\.json$" OR relative MATCHES "\\.\\.")
    message(FATAL_ERROR "${input}: not a .json file under ${BASE} with a name of [A-Za-z0-9_./-]")
  endif()
  string(REGEX REPLACE "\\.json$" "" name "${relative}")
  file(READ ${input} text)
  string(FIND "${text}" ")amp_schema\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${input} contains the raw-string delimiter")
  endif()
  string(APPEND body "      {\"${name}\", R\"amp_schema(${text})amp_schema\"},\n")
endforeach()
string(APPEND body "  };\n  return all;\n}\n}  // namespace amp::detail\n")
file(WRITE ${OUTPUT}.tmp "${body}")
file(COPY_FILE ${OUTPUT}.tmp ${OUTPUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUTPUT}.tmp)
