# Every dependency comes from a Debian bookworm package (see scripts/install-deps).
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)
find_package(simdjson REQUIRED)
find_package(fmt REQUIRED)
find_package(valijson REQUIRED)
find_package(PkgConfig REQUIRED)
