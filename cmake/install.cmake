# Installs libamp and its headers and, when websocketpp was found, the client library
# (libamp-client, amp/client.hpp) and the programs amp-server and amp; with libpq and SQLite,
# the sink library (libamp-sink, amp/sink/) and amp-sink, with a CMake package
# (find_package(amp) gives amp::amp, and amp::client: the component `client`) and
# pkg-config files (amp.pc, amp-client.pc). Included from the top-level CMakeLists.txt
# when AMP_INSTALL is on.

set(AMP_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/amp)
set(AMP_PKGCONFIG_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
set(AMP_PACKAGE_BINARY_DIR ${PROJECT_BINARY_DIR}/package)

# The libraries of the package, and the pkg-config module and description of each.
set(AMP_PACKAGE_LIBRARIES amp)
set(AMP_PC_DESCRIPTION_amp "${PROJECT_DESCRIPTION}")
if(TARGET amp-client)
  list(APPEND AMP_PACKAGE_LIBRARIES amp-client)
  set(AMP_PC_DESCRIPTION_amp-client "C++ client of the amp.v1 protocol over WebSocket")
endif()
if(TARGET amp-sink-lib)
  list(APPEND AMP_PACKAGE_LIBRARIES amp-sink-lib)
  set(AMP_PC_DESCRIPTION_amp-sink-lib "Commit-then-ack archives of AMP streams into PostgreSQL, SQLite and files")
  set(AMP_PC_MODULE_amp-sink-lib amp-sink)  # the target's name is taken by the program
endif()

install(TARGETS ${AMP_PACKAGE_LIBRARIES} EXPORT amp-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/amp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h" PATTERN "*.ipp")
if(TARGET amp-client)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/client/include/amp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.hpp")
endif()
# The programs (amp-cli is installed as `amp`).
foreach(program IN ITEMS amp-server amp-cli amp-sink)
  if(TARGET ${program})
    install(TARGETS ${program} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()
install(EXPORT amp-targets NAMESPACE amp:: DESTINATION ${AMP_CMAKE_INSTALL_DIR})

write_basic_package_version_file(${AMP_PACKAGE_BINARY_DIR}/amp-config-version.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${AMP_PACKAGE_BINARY_DIR}/amp-config.cmake
              ${AMP_PACKAGE_BINARY_DIR}/amp-config-version.cmake
        DESTINATION ${AMP_CMAKE_INSTALL_DIR})
# Each library's pkg-config module is named as the library, unless AMP_PC_MODULE_<library>
# says otherwise.
foreach(library IN LISTS AMP_PACKAGE_LIBRARIES)
  if(NOT AMP_PC_MODULE_${library})
    set(AMP_PC_MODULE_${library} ${library})
  endif()
  install(FILES ${AMP_PACKAGE_BINARY_DIR}/${AMP_PC_MODULE_${library}}.pc
          DESTINATION ${AMP_PKGCONFIG_INSTALL_DIR})
endforeach()

# Writes amp-config.cmake and one pkg-config file per library. What a consumer must find
# is read from each library's INTERFACE_LINK_LIBRARIES, i.e. exactly what the export
# holds: the public dependencies, plus, for a static library, the private ones as
# $<LINK_ONLY:...>. $<BUILD_INTERFACE:...> entries are not exported. An imported target
# that is not known here stops the configure step rather than produce a package that
# cannot be found.

# Reads what `library` links: appends find_dependency() code for amp-config.cmake to
# amp_find_lines (each package once, over all libraries: amp_seen_packages) and sets
# pc_requires_public/private and pc_libs_public/private for its .pc file, in the caller.
function(_amp_package_links library)
  get_target_property(links ${library} INTERFACE_LINK_LIBRARIES)
  if(NOT links)
    set(links "")
  endif()
  set(find_lines "${amp_find_lines}")
  set(seen_packages "${amp_seen_packages}")
  foreach(scope IN ITEMS public private)
    set(pc_requires_${scope} "")
    set(pc_libs_${scope} "")
  endforeach()

  foreach(item IN LISTS links)
    if(item MATCHES "BUILD_INTERFACE")
      continue()
    endif()
    set(scope public)
    if(item MATCHES "^\\$<LINK_ONLY:(.+)>$")
      set(item "${CMAKE_MATCH_1}")
      set(scope private)
    endif()
    if(item MATCHES "\\$<")
      message(FATAL_ERROR "cmake/install.cmake: ${library} links '${item}', a generator "
                          "expression it cannot translate for amp-config.cmake and ${library}.pc")
    endif()

    set(package "")    # find_dependency() argument
    set(pc_module "")  # pkg-config module for the .pc file
    if(item STREQUAL "Threads::Threads")
      set(package Threads)
      list(APPEND pc_libs_${scope} ${CMAKE_THREAD_LIBS_INIT})
    elseif(item STREQUAL "simdjson::simdjson")
      set(package simdjson)
      set(pc_module simdjson)
    elseif(item MATCHES "^fmt::fmt(-header-only)?$")
      set(package fmt)
      set(pc_module fmt)
    elseif(item STREQUAL "OpenSSL::SSL")
      set(package OpenSSL)
      set(pc_module libssl)
    elseif(item STREQUAL "OpenSSL::Crypto")
      set(package OpenSSL)
      set(pc_module libcrypto)
    elseif(item STREQUAL "websocketpp::websocketpp")
      set(package websocketpp)  # header-only, no pkg-config module
    elseif(item MATCHES "^PkgConfig::(.+)$")
      # Made by pkg_check_modules(<prefix> IMPORTED_TARGET <module>); FindPkgConfig keeps
      # the module name in <prefix>_MODULE_NAME when one module was asked for.
      set(prefix "${CMAKE_MATCH_1}")
      set(pc_module "${${prefix}_MODULE_NAME}")
      if(NOT pc_module)
        message(FATAL_ERROR "cmake/install.cmake: ${library} links ${item}, but the pkg-config "
                            "module behind it is unknown (use one module per IMPORTED_TARGET)")
      endif()
      if(NOT "PkgConfig" IN_LIST seen_packages)
        list(APPEND seen_packages PkgConfig)
        string(APPEND find_lines "find_dependency(PkgConfig)\n")
      endif()
      if(NOT "${item}" IN_LIST seen_packages)
        list(APPEND seen_packages "${item}")
        string(APPEND find_lines
               "if(NOT TARGET ${item})\n"
               "  pkg_check_modules(${prefix} QUIET IMPORTED_TARGET ${pc_module})\n"
               "  if(NOT ${prefix}_FOUND)\n"
               "    set(amp_NOT_FOUND_MESSAGE \"amp needs the pkg-config module ${pc_module}\")\n"
               "    set(amp_FOUND FALSE)\n"
               "    return()\n"
               "  endif()\n"
               "endif()\n")
      endif()
    elseif(TARGET "${item}")
      get_target_property(imported "${item}" IMPORTED)
      if(imported)
        message(FATAL_ERROR "cmake/install.cmake: ${library} links ${item}; tell this file which "
                            "package provides it so that amp-config.cmake can find it")
      endif()
      # A library of this package (install(EXPORT) itself insists that it is exported):
      # its own .pc file is the pkg-config module.
      get_target_property(aliased "${item}" ALIASED_TARGET)
      if(aliased)
        set(item "${aliased}")
      endif()
      if(NOT item IN_LIST AMP_PACKAGE_LIBRARIES)
        message(FATAL_ERROR "cmake/install.cmake: ${library} links ${item}, which the package "
                            "does not install")
      endif()
      set(pc_module "${AMP_PC_MODULE_${item}}")
    elseif(item MATCHES "^-" OR IS_ABSOLUTE "${item}")
      list(APPEND pc_libs_${scope} "${item}")
    else()
      list(APPEND pc_libs_${scope} "-l${item}")
    endif()

    if(package AND NOT package IN_LIST seen_packages)
      list(APPEND seen_packages ${package})
      string(APPEND find_lines "find_dependency(${package})\n")
    endif()
    if(pc_module)
      list(APPEND pc_requires_${scope} ${pc_module})
    endif()
  endforeach()

  set(amp_find_lines "${find_lines}" PARENT_SCOPE)
  set(amp_seen_packages "${seen_packages}" PARENT_SCOPE)
  foreach(scope IN ITEMS public private)
    set(pc_requires_${scope} "${pc_requires_${scope}}" PARENT_SCOPE)
    set(pc_libs_${scope} "${pc_libs_${scope}}" PARENT_SCOPE)
  endforeach()
endfunction()

function(_amp_write_package_files)
  set(amp_find_lines "")  # CMake code for amp-config.cmake
  set(amp_seen_packages "")

  # The .pc files locate the prefix from their own directory, so that the installed tree
  # can be moved (and `cmake --install --prefix` works) unless the install dirs are absolute.
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
    set(AMP_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
    set(AMP_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
    set(AMP_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
  else()
    file(RELATIVE_PATH up "/prefix/${AMP_PKGCONFIG_INSTALL_DIR}" "/prefix")
    string(REGEX REPLACE "/$" "" up "${up}")
    set(AMP_PC_PREFIX "\${pcfiledir}/${up}")
    set(AMP_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
    set(AMP_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
  endif()

  foreach(library IN LISTS AMP_PACKAGE_LIBRARIES)
    _amp_package_links(${library})
    set(AMP_PC_NAME "${AMP_PC_MODULE_${library}}")
    set(AMP_PC_DESCRIPTION "${AMP_PC_DESCRIPTION_${library}}")
    get_target_property(AMP_PC_LIBNAME ${library} OUTPUT_NAME)
    if(NOT AMP_PC_LIBNAME)
      set(AMP_PC_LIBNAME ${library})
    endif()
    foreach(scope IN ITEMS public private)
      list(REMOVE_DUPLICATES pc_requires_${scope})
      list(REMOVE_DUPLICATES pc_libs_${scope})
      list(JOIN pc_requires_${scope} ", " pc_requires_${scope})
      list(JOIN pc_libs_${scope} " " pc_libs_${scope})
    endforeach()
    if(pc_libs_public)
      string(PREPEND pc_libs_public " ")  # follows -l<library> on the Libs line
    endif()
    set(AMP_PC_REQUIRES "${pc_requires_public}")
    set(AMP_PC_REQUIRES_PRIVATE "${pc_requires_private}")
    set(AMP_PC_LIBS "${pc_libs_public}")
    set(AMP_PC_LIBS_PRIVATE "${pc_libs_private}")
    configure_file(${PROJECT_SOURCE_DIR}/cmake/amp.pc.in
                   ${AMP_PACKAGE_BINARY_DIR}/${AMP_PC_NAME}.pc @ONLY)
  endforeach()

  set(AMP_FIND_DEPENDENCIES "${amp_find_lines}")
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/amp-config.cmake.in
                                ${AMP_PACKAGE_BINARY_DIR}/amp-config.cmake
                                INSTALL_DESTINATION ${AMP_CMAKE_INSTALL_DIR})
endfunction()

# Deferred to the end of the top-level directory, so that link libraries added to the
# libraries after this file was included (or from a subdirectory) are seen too.
cmake_language(DEFER CALL _amp_write_package_files)
