# Installs libamp and its headers, with a CMake package (find_package(amp) gives amp::amp)
# and a pkg-config file (amp.pc). Included from the top-level CMakeLists.txt when
# AMP_INSTALL is on.

set(AMP_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/amp)
set(AMP_PKGCONFIG_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
set(AMP_PACKAGE_BINARY_DIR ${PROJECT_BINARY_DIR}/package)

install(TARGETS amp EXPORT amp-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/amp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h" PATTERN "*.ipp")
install(EXPORT amp-targets NAMESPACE amp:: DESTINATION ${AMP_CMAKE_INSTALL_DIR})

write_basic_package_version_file(${AMP_PACKAGE_BINARY_DIR}/amp-config-version.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${AMP_PACKAGE_BINARY_DIR}/amp-config.cmake
              ${AMP_PACKAGE_BINARY_DIR}/amp-config-version.cmake
        DESTINATION ${AMP_CMAKE_INSTALL_DIR})
install(FILES ${AMP_PACKAGE_BINARY_DIR}/amp.pc DESTINATION ${AMP_PKGCONFIG_INSTALL_DIR})

# Writes amp-config.cmake and amp.pc. What a consumer must find is read from amp's
# INTERFACE_LINK_LIBRARIES, i.e. exactly what the export holds: the public dependencies,
# plus, for a static libamp, the private ones as $<LINK_ONLY:...>. $<BUILD_INTERFACE:...>
# entries are not exported. An imported target that is not known here stops the
# configure step rather than produce a package that cannot be found.
function(_amp_write_package_files)
  get_target_property(links amp INTERFACE_LINK_LIBRARIES)
  if(NOT links)
    set(links "")
  endif()
  set(find_lines "")  # CMake code for amp-config.cmake
  set(seen_packages "")
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
      message(FATAL_ERROR "cmake/install.cmake: amp links '${item}', a generator expression "
                          "it cannot translate for amp-config.cmake and amp.pc")
    endif()

    set(package "")    # find_dependency() argument
    set(pc_module "")  # pkg-config module for amp.pc
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
        message(FATAL_ERROR "cmake/install.cmake: amp links ${item}, but the pkg-config "
                            "module behind it is unknown (use one module per IMPORTED_TARGET)")
      endif()
      if(NOT "PkgConfig" IN_LIST seen_packages)
        list(APPEND seen_packages PkgConfig)
        string(APPEND find_lines "find_dependency(PkgConfig)\n")
      endif()
      string(APPEND find_lines
             "if(NOT TARGET ${item})\n"
             "  pkg_check_modules(${prefix} QUIET IMPORTED_TARGET ${pc_module})\n"
             "  if(NOT ${prefix}_FOUND)\n"
             "    set(amp_NOT_FOUND_MESSAGE \"amp needs the pkg-config module ${pc_module}\")\n"
             "    set(amp_FOUND FALSE)\n"
             "    return()\n"
             "  endif()\n"
             "endif()\n")
    elseif(TARGET "${item}")
      get_target_property(imported "${item}" IMPORTED)
      if(imported)
        message(FATAL_ERROR "cmake/install.cmake: amp links ${item}; tell this file which "
                            "package provides it so that amp-config.cmake can find it")
      endif()
      # A target of this project: install(EXPORT) itself insists it is exported.
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

  set(AMP_FIND_DEPENDENCIES "${find_lines}")
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/amp-config.cmake.in
                                ${AMP_PACKAGE_BINARY_DIR}/amp-config.cmake
                                INSTALL_DESTINATION ${AMP_CMAKE_INSTALL_DIR})

  # amp.pc locates the prefix from its own directory, so that the installed tree can be
  # moved (and `cmake --install --prefix` works) unless the install dirs are absolute.
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
  get_target_property(AMP_PC_LIBNAME amp OUTPUT_NAME)
  if(NOT AMP_PC_LIBNAME)
    set(AMP_PC_LIBNAME amp)
  endif()
  foreach(scope IN ITEMS public private)
    list(REMOVE_DUPLICATES pc_requires_${scope})
    list(REMOVE_DUPLICATES pc_libs_${scope})
    list(JOIN pc_requires_${scope} ", " pc_requires_${scope})
    list(JOIN pc_libs_${scope} " " pc_libs_${scope})
  endforeach()
  if(pc_libs_public)
    string(PREPEND pc_libs_public " ")  # follows -lamp on the Libs line
  endif()
  set(AMP_PC_REQUIRES "${pc_requires_public}")
  set(AMP_PC_REQUIRES_PRIVATE "${pc_requires_private}")
  set(AMP_PC_LIBS "${pc_libs_public}")
  set(AMP_PC_LIBS_PRIVATE "${pc_libs_private}")
  configure_file(${PROJECT_SOURCE_DIR}/cmake/amp.pc.in ${AMP_PACKAGE_BINARY_DIR}/amp.pc @ONLY)
endfunction()

# Deferred to the end of the top-level directory, so that link libraries added to amp
# after this file was included (or from a subdirectory) are seen too.
cmake_language(DEFER CALL _amp_write_package_files)
