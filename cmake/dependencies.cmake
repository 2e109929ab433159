# Every dependency comes from a Debian bookworm package (see scripts/install-deps).
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)
find_package(simdjson REQUIRED)
find_package(fmt REQUIRED)
find_package(valijson REQUIRED)
find_package(PkgConfig REQUIRED)
# cnats has a CMake config on Debian, but it names a static library and a protobuf-c
# library that the package does not ship: use pkg-config.
if(NOT TARGET PkgConfig::NATS)
  pkg_check_modules(NATS REQUIRED IMPORTED_TARGET libnats)
endif()
find_package(OpenSSL REQUIRED)
# websocketpp (for the WebSocket server) is optional: without it amp::websocketpp is absent.
find_package(websocketpp CONFIG QUIET)
if(websocketpp_FOUND)
  include(${CMAKE_CURRENT_LIST_DIR}/websocketpp.cmake)
endif()
# libpq and SQLite (for the sink library and amp-sink) are optional: without them neither
# is built.
if(NOT TARGET PkgConfig::PQ)
  pkg_check_modules(PQ QUIET IMPORTED_TARGET libpq)
endif()
if(NOT TARGET PkgConfig::SQLITE3)
  pkg_check_modules(SQLITE3 QUIET IMPORTED_TARGET sqlite3)
endif()
