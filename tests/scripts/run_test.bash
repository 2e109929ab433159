#!/usr/bin/env bash
# scripts/run (the main command) as a user meets it when a port is taken: it refuses with
# a message naming the port, the process and what to do, before it installs or builds
# anything. It runs in a copy of the repository's scripts ($work/repo) whose install-deps
# is a stub that leaves a mark, and with `cmake` a stub on PATH, so nothing is built here.
# shellcheck source=tests/scripts/lib.bash
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"

repo=${work}/repo
mkdir -p "${repo}/scripts/lib" "${work}/bin"
cp "${source_dir}/scripts/run" "${repo}/scripts/run"
cp "${source_dir}/scripts/lib/ports.bash" "${repo}/scripts/lib/ports.bash"
printf '#!/bin/sh\ntouch "%s/installed-deps"\n' "${work}" >"${repo}/scripts/install-deps"
printf '#!/bin/sh\necho "cmake $*" >>"%s/cmake.log"\n' "${work}" >"${work}/bin/cmake"
chmod +x "${repo}/scripts/install-deps" "${work}/bin/cmake"
nats=""  # the real nats-server, for the tests that start one (nats_server_binary)

# Runs the copied scripts/run with the environment given as NAME=VALUE arguments.
run_main() {
  run_capture env "PATH=${work}/bin:${PATH}" "$@" /bin/bash "${repo}/scripts/run"
}

# run_main on nats_port and listen_port, with more NAME=VALUE arguments.
run_main_on_ports() {
  run_main "AMP_NATS_PORT=${nats_port}" "AMP_LISTEN=127.0.0.1:${listen_port}" "$@"
}

# Sets nats_port and listen_port to two free ports.
nats_port=0
listen_port=0
pick_ports() {
  local ports
  ports=$(choose_free_ports 2)
  read -r nats_port listen_port <<<"${ports}"
}

# Starts a nats-server without JetStream (as Debian's service runs) on port $1.
hold_port_with_nats() {
  nats=$(nats_server_binary)
  "${nats}" -a 127.0.0.1 -p "$1" >"${work}/holder.log" 2>&1 &
  holder_pid=$!
  track_pid "${holder_pid}"
  wait_for_port "$1"
}

test_refuses_a_nats_port_held_by_another_process() {
  pick_ports
  hold_port_with_nats "${nats_port}"
  run_main_on_ports
  expect_rc 1 "${last_rc}" "scripts/run with its NATS port taken"
  expect_contains "${last_err}" \
    "port ${nats_port} (nats-server) is held by nats-server (pid ${holder_pid}); nothing was started" \
    "the message names the port and the process"
  expect_contains "${last_err}" "AMP_NATS_PORT=" "the message says how to choose another port"
  if [[ -e ${work}/installed-deps || -e ${work}/cmake.log ]]; then
    fail "scripts/run installed or built before refusing"
  fi
  kill -0 "${holder_pid}" 2>/dev/null || fail "the process holding the port was disturbed"
}

test_refuses_a_listen_port_held_by_another_process() {
  pick_ports
  hold_port_with_nats "${listen_port}"
  run_main_on_ports
  expect_rc 1 "${last_rc}" "scripts/run with amp-server's port taken"
  expect_contains "${last_err}" "port ${listen_port} (amp-server) is held by nats-server (pid ${holder_pid})" \
    "the message names the port and the process"
  expect_contains "${last_err}" "AMP_LISTEN=" "the message says how to choose another port"
  if [[ -e ${work}/installed-deps ]]; then fail "scripts/run installed before refusing"; fi
}

test_refuses_a_bad_port() {
  run_main "AMP_NATS_PORT=42x"
  expect_rc 2 "${last_rc}" "AMP_NATS_PORT=42x"
  expect_contains "${last_err}" "AMP_NATS_PORT must be a port number" "the message"
  run_main "AMP_LISTEN=localhost"
  expect_rc 2 "${last_rc}" "AMP_LISTEN=localhost"
  expect_contains "${last_err}" "AMP_LISTEN must be HOST:PORT" "the message"
  if [[ -e ${work}/installed-deps ]]; then fail "scripts/run installed before refusing"; fi
}

# The port was free when checked, but the server that answers there is not the one the
# script started (another one took the port first): it must not go on with it.
test_refuses_a_nats_server_that_is_not_its_own() {
  nats=$(nats_server_binary)
  pick_ports
  # Started as the script's nats-server, it runs another one (no JetStream, another name)
  # on the same port and stays alive, as a server that lost the race to bind would not.
  cat >"${work}/bin/impostor" <<IMPOSTOR
#!/usr/bin/env bash
"${nats}" -a 127.0.0.1 -p ${nats_port} -n somebody-else &
trap 'kill \$! 2>/dev/null; wait \$!; exit 0' TERM
wait
IMPOSTOR
  chmod +x "${work}/bin/impostor"
  run_main_on_ports "AMP_NATS_SERVER=${work}/bin/impostor"
  expect_rc 1 "${last_rc}" "scripts/run when another server answers on its port"
  expect_contains "${last_err}" \
    "the NATS server answering on port ${nats_port} is not the one this script started" "the message"
  if port_answers 127.0.0.1 "${nats_port}"; then
    fail "what scripts/run started is still running after it exited"
  fi
}

# A stand-in build/bin/amp (prints a token) and build/bin/amp-server: it records its
# arguments and the INFO line of the NATS it is given, marks that it runs, and, when
# AMP_TEST_SERVE is set, serves until SIGTERM, recording whether NATS still answered then.
make_stand_ins() {
  mkdir -p "${repo}/build/bin"
  printf '#!/bin/sh\necho "token-for-$*"\n' >"${repo}/build/bin/amp"
  cat >"${repo}/build/bin/amp-server" <<'SERVER'
#!/usr/bin/env bash
source "$(dirname "$0")/../../scripts/lib/ports.bash"
echo "$*" >"${AMP_TEST_WORK}/server.args"
port=${4##*:}
first_line_from "${port}" >"${AMP_TEST_WORK}/server.info"
if [[ -z ${AMP_TEST_SERVE:-} ]]; then exit 0; fi
on_term() {
  if port_answers 127.0.0.1 "${port}"; then echo up; else echo down; fi >"${AMP_TEST_WORK}/nats-at-term"
  exit 0
}
trap on_term TERM
touch "${AMP_TEST_WORK}/serving"
while :; do sleep 0.1; done
SERVER
  chmod +x "${repo}/build/bin/amp" "${repo}/build/bin/amp-server"
  nats=$(nats_server_binary)
}

# The way through, without building: the script starts its own nats-server (JetStream),
# prints the token from build/bin/amp, runs build/bin/amp-server on it, and stops
# nats-server when amp-server ends.
test_starts_its_nats_server_and_stops_it_afterwards() {
  pick_ports
  make_stand_ins
  run_main_on_ports "AMP_TEST_WORK=${work}" "AMP_NATS_SERVER=${nats}"
  expect_rc 0 "${last_rc}" "scripts/run with a stand-in amp-server that exits 0"
  [[ -e ${work}/installed-deps ]] || fail "install-deps was not run"
  expect_contains "$(<"${work}/cmake.log")" "--target amp-server amp-cli" "the server and the CLI are built"
  expect_contains "${last_out}" "export AMP_URL=ws://127.0.0.1:${listen_port}/amp AMP_TOKEN=token-for-token" \
    "the token and the URL are printed"
  expect_contains "$(<"${work}/server.args")" \
    "--listen 127.0.0.1:${listen_port} --nats nats://127.0.0.1:${nats_port} --secret-file var/dev-secret" \
    "amp-server's arguments"
  expect_contains "$(<"${work}/server.info")" '"jetstream":true' "amp-server got a NATS with JetStream"
  [[ -s ${repo}/var/dev-secret ]] || fail "no development secret in var/"
  if port_answers 127.0.0.1 "${nats_port}"; then fail "nats-server still runs after scripts/run"; fi
}

# Ctrl-C (SIGINT, from the terminal) or SIGTERM: amp-server is stopped first, while NATS
# still answers, then nats-server; the script exits with amp-server's status.
stops_both_on() {
  local signal=$1 pid rc=0 _
  pick_ports
  make_stand_ins
  env --default-signal "PATH=${work}/bin:${PATH}" "AMP_NATS_PORT=${nats_port}" \
    "AMP_LISTEN=127.0.0.1:${listen_port}" "AMP_TEST_WORK=${work}" "AMP_NATS_SERVER=${nats}" \
    AMP_TEST_SERVE=1 /bin/bash "${repo}/scripts/run" >"${work}/run.out" 2>&1 &
  pid=$!
  track_pid "${pid}"
  for _ in $(seq 200); do
    if [[ -e ${work}/serving ]]; then break; fi
    sleep 0.1
  done
  [[ -e ${work}/serving ]] || fail "the stand-in amp-server did not start: $(<"${work}/run.out")"
  kill "-${signal}" "${pid}"
  for _ in $(seq 100); do
    if ! kill -0 "${pid}" 2>/dev/null; then break; fi
    sleep 0.1
  done
  if kill -0 "${pid}" 2>/dev/null; then fail "scripts/run still runs 10 s after SIG${signal}"; fi
  wait "${pid}" || rc=$?
  expect_rc 0 "${rc}" "scripts/run after SIG${signal} (amp-server's status)"
  [[ -e ${work}/nats-at-term ]] || fail "amp-server got no SIGTERM"
  expect_rc up "$(<"${work}/nats-at-term")" "NATS when amp-server was told to stop"
  if port_answers 127.0.0.1 "${nats_port}"; then fail "nats-server still runs after scripts/run"; fi
}

test_ctrl_c_stops_amp_server_then_nats_server() { stops_both_on INT; }

test_sigterm_stops_amp_server_then_nats_server() { stops_both_on TERM; }

# A nats-server that comes up without JetStream (here: a stand-in that drops -js) is
# refused, not handed to amp-server.
test_refuses_a_nats_server_without_jetstream() {
  pick_ports
  make_stand_ins
  cat >"${work}/bin/no-jetstream" <<STUB
#!/usr/bin/env bash
args=()
for a in "\$@"; do if [[ \$a != -js ]]; then args+=("\$a"); fi; done
exec "${nats}" "\${args[@]}"
STUB
  chmod +x "${work}/bin/no-jetstream"
  run_main_on_ports "AMP_TEST_WORK=${work}" "AMP_NATS_SERVER=${work}/bin/no-jetstream"
  expect_rc 1 "${last_rc}" "scripts/run on a nats-server without JetStream"
  expect_contains "${last_err}" "nats-server on port ${nats_port} runs without JetStream" "the message"
  if [[ -e ${work}/server.args ]]; then fail "amp-server was started on it"; fi
  if port_answers 127.0.0.1 "${nats_port}"; then fail "that nats-server still runs"; fi
}

run_test "$@"
