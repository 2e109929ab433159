# shellcheck shell=bash disable=SC2034  # its variables are for the files that source it
# The harness of the scripts' own tests: one test is one bash function `test_*` in a
# *_test.bash file, run by ctest as `bash FILE test_NAME` (tests/scripts/CMakeLists.txt
# registers every function it finds). Each test gets a fresh temporary directory ($work),
# removed afterwards with every process it registered with `track_pid`.
set -euo pipefail

source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=scripts/lib/ports.bash
source "${source_dir}/scripts/lib/ports.bash"
work=$(mktemp -d "${TMPDIR:-/tmp}/amp-scripts-test.XXXXXX")
tracked_pids=()

track_pid() { tracked_pids+=("$1"); }

cleanup() {
  local pid proc cwd alive _
  for pid in "${tracked_pids[@]}"; do kill "${pid}" 2>/dev/null || true; done
  for _ in $(seq 50); do
    alive=0
    for pid in "${tracked_pids[@]}"; do
      if kill -0 "${pid}" 2>/dev/null; then alive=1; fi
    done
    if ((alive == 0)); then break; fi
    sleep 0.1
  done
  for pid in "${tracked_pids[@]}"; do
    kill -KILL "${pid}" 2>/dev/null || true
    wait "${pid}" 2>/dev/null || true
  done
  # Whatever a failed test left running in its directory (a server the script under test
  # did not stop) would outlive the test and hold its output open.
  for proc in /proc/[0-9]*; do
    cwd=$(readlink "${proc}/cwd" 2>/dev/null) || continue
    if [[ ${cwd} == "${work}" || ${cwd} == "${work}"/* ]]; then kill -KILL "${proc#/proc/}" 2>/dev/null || true; fi
  done
  rm -rf "${work}"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# expect_rc EXPECTED ACTUAL WHAT
expect_rc() {
  if [[ $1 != "$2" ]]; then fail "$3: exit status $2, expected $1"; fi
}

# expect_contains TEXT NEEDLE WHAT
expect_contains() {
  if [[ $1 != *"$2"* ]]; then fail "$3: expected to contain '$2'; it was:"$'\n'"$1"; fi
}

# expect_not_contains TEXT NEEDLE WHAT
expect_not_contains() {
  if [[ $1 == *"$2"* ]]; then fail "$3: expected not to contain '$2'; it was:"$'\n'"$1"; fi
}

# run_capture COMMAND...: runs COMMAND with a 120 s limit; sets last_rc, last_out and
# last_err (its exit status, standard output and standard error).
last_rc=0
last_out=""
last_err=""
run_capture() {
  last_rc=0
  timeout 120 "$@" >"${work}/last.out" 2>"${work}/last.err" || last_rc=$?
  if ((last_rc == 124)); then fail "$* did not finish within 120 s"; fi
  last_out=$(<"${work}/last.out")
  last_err=$(<"${work}/last.err")
}

# The nats-server binary: $AMP_NATS_SERVER, else from PATH or /usr/sbin.
nats_server_binary() {
  if [[ -n ${AMP_NATS_SERVER:-} ]]; then
    echo "${AMP_NATS_SERVER}"
  elif command -v nats-server >/dev/null 2>&1; then
    command -v nats-server
  elif [[ -x /usr/sbin/nats-server ]]; then
    echo /usr/sbin/nats-server
  else
    fail "nats-server not found (set AMP_NATS_SERVER)"
  fi
}

# Waits up to 10 s for something to accept connections on 127.0.0.1:$1.
wait_for_port() {
  local _
  for _ in $(seq 100); do
    if port_answers 127.0.0.1 "$1"; then return 0; fi
    sleep 0.1
  done
  fail "nothing answered on port $1 within 10 s"
}

# Runs the test named $1 (a function of the file that sourced this one).
run_test() {
  local name=${1:?which test} kind
  kind=$(type -t "${name}") || kind=""
  if [[ ${kind} != function || ${name} != test_* ]]; then
    fail "no test named ${name}"
  fi
  "${name}"
  echo "ok: ${name}"
}
