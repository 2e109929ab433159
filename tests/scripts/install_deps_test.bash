#!/usr/bin/env bash
# scripts/install-deps on a simulated Debian machine: dpkg-query, apt-get, systemctl and
# sudo are the stubs of tests/scripts/stubs (their state in $work/state), and PATH holds
# nothing else but the few tools the script needs, so Node.js and npm are missing too.
# shellcheck source=tests/scripts/lib.bash
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"

stubs_dir=${source_dir}/tests/scripts/stubs
state=${work}/state
log_file=${state}/apt.log
mkdir -p "${state}/bin" "${state}/tools"
cp "${stubs_dir}"/* "${state}/bin/"
touch "${state}/installed" "${log_file}"
for tool in bash env tee chmod rm sed grep sleep cat; do
  tool_path=$(command -v "${tool}") || fail "${tool} not found"
  ln -s "${tool_path}" "${state}/tools/${tool}"
done
export STUB_STATE=${state}
export AMP_POLICY_RC_D=${work}/policy-rc.d

base_packages=(g++ cmake ninja-build pkg-config git clang-format shellcheck libnats-dev
  libasio-dev libsimdjson-dev libvalijson-dev libssl-dev libfmt-dev libwebsocketpp-dev
  catch2 nats-server clang-14 libclang-rt-14-dev libpq-dev libsqlite3-dev postgresql)

# Runs scripts/install-deps with ARGS on the simulated machine (see run_capture), with
# every signal at its default disposition, as from a terminal (a shell cannot trap a
# signal that was ignored when it started, as SIGINT is in background jobs).
install_deps() {
  run_capture env --default-signal "PATH=${state}/bin:${state}/tools" /bin/bash \
    "${source_dir}/scripts/install-deps" "$@"
}

mark_installed() { printf '%s\n' "$@" >>"${state}/installed"; }

# Every package of the default list installed, and a node and an npm on PATH.
machine_has_everything() {
  mark_installed "${base_packages[@]}"
  printf '#!/bin/sh\n' >"${state}/bin/node"
  printf '#!/bin/sh\n' >"${state}/bin/npm"
  chmod +x "${state}/bin/node" "${state}/bin/npm"
}

test_installs_what_is_missing_and_exits_0() {
  install_deps
  expect_rc 0 "${last_rc}" "install-deps on a machine with nothing"
  local log
  log=$(<"${log_file}")
  expect_contains "${log}" "apt-get update" "apt-get update ran"
  expect_contains "${log}" "apt-get install -y --no-install-recommends ${base_packages[*]} nodejs npm" \
    "every package and Node.js were asked for"
  expect_contains "${log}" "policy-rc.d nats-server.service: 101" \
    "nats-server's service was kept from starting during the install"
  expect_contains "${log}" "policy-rc.d redis-server: 101" "so was redis-server's (invoke-rc.d's name)"
  expect_contains "${log}" "policy-rc.d postgresql.service: 101" "so was postgresql's"
  expect_contains "${log}" "policy-rc.d postgresql@15-main.service: 101" "and its cluster's instance"
  expect_contains "${log}" "policy-rc.d cron.service: 0" "another package's service starts as usual"
  expect_contains "${log}" "systemctl disable --quiet postgresql.service" \
    "Debian's postgresql service is disabled"
  expect_contains "${log}" "DEBIAN_FRONTEND: noninteractive" "the install asks no questions"
  expect_contains "${log}" "systemctl disable --quiet nats-server.service" \
    "Debian's nats-server service is disabled"
  expect_not_contains "${log}" "nodejs npm redis-server" "nothing of the benchmarks without --bench"
  expect_not_contains "${log}" "systemctl disable --quiet redis-server" "no redis-server to disable"
  expect_contains "${last_out}" "install-deps: installed" "it says what it installed"
  if [[ -e ${AMP_POLICY_RC_D} ]]; then fail "the policy-rc.d it wrote is still there"; fi
  local pkg
  for pkg in "${base_packages[@]}" nodejs npm; do
    grep -qxF "${pkg}" "${state}/installed" || fail "${pkg} was not installed"
  done
}

test_is_idempotent() {
  install_deps
  expect_rc 0 "${last_rc}" "the first run"
  local calls
  calls=$(grep -c '^apt-get' "${log_file}") || true
  install_deps
  expect_rc 0 "${last_rc}" "the second run"
  expect_contains "${last_out}" "all dependencies present" "the second run finds everything"
  local calls_after
  calls_after=$(grep -c '^apt-get' "${log_file}") || true
  expect_rc "${calls}" "${calls_after}" "apt-get calls after the second run"
  install_deps
  expect_rc 0 "${last_rc}" "the third run"
}

test_installs_only_the_missing_ones() {
  machine_has_everything
  sed -i '/^libnats-dev$/d' "${state}/installed"
  install_deps
  expect_rc 0 "${last_rc}" "install-deps with one package missing"
  expect_contains "$(<"${log_file}")" "apt-get install -y --no-install-recommends libnats-dev"$'\n' \
    "only the missing package is asked for"
  expect_not_contains "$(<"${log_file}")" "systemctl" \
    "the service of a nats-server that was already installed is left alone"
}

test_bench_adds_its_packages() {
  machine_has_everything
  install_deps --bench
  expect_rc 0 "${last_rc}" "install-deps --bench"
  expect_contains "$(<"${log_file}")" "apt-get install -y --no-install-recommends redis-server gnuplot-nox"$'\n' \
    "the benchmarks' packages"
  expect_contains "$(<"${log_file}")" "systemctl disable --quiet redis-server.service" \
    "Debian's redis-server service is disabled"
}

test_fails_clearly_when_apt_get_install_fails() {
  STUB_APT_INSTALL_RC=100 install_deps
  expect_rc 1 "${last_rc}" "install-deps when apt-get install fails"
  expect_contains "${last_err}" "install-deps: apt-get install failed (exit 100) for: g++" \
    "the message says what failed"
  if [[ -e ${AMP_POLICY_RC_D} ]]; then fail "the policy-rc.d it wrote is still there"; fi
  expect_not_contains "$(<"${log_file}")" "systemctl" "nothing is disabled after a failed install"
}

test_fails_clearly_when_apt_get_update_fails() {
  STUB_APT_UPDATE_RC=100 install_deps
  expect_rc 1 "${last_rc}" "install-deps when apt-get update fails"
  expect_contains "${last_err}" "install-deps: apt-get update failed (exit 100)" "the message"
  expect_not_contains "$(<"${log_file}")" "apt-get install" "no install after a failed update"
  if [[ -e ${AMP_POLICY_RC_D} ]]; then fail "the policy-rc.d it wrote is still there"; fi
}

test_fails_when_a_package_is_still_missing() {
  STUB_APT_SKIP=nats-server install_deps
  expect_rc 1 "${last_rc}" "install-deps when a package did not get installed"
  expect_contains "${last_err}" "still not installed: nats-server" "the message names it"
}

test_leaves_an_existing_policy_alone() {
  printf '#!/bin/sh\n# the machine own\nexit 0\n' >"${AMP_POLICY_RC_D}"
  chmod +x "${AMP_POLICY_RC_D}"
  local before
  before=$(<"${AMP_POLICY_RC_D}")
  install_deps
  expect_rc 0 "${last_rc}" "install-deps with a policy-rc.d in place"
  expect_contains "$(<"${log_file}")" "policy-rc.d nats-server.service: 0" \
    "the machine's own policy was the one in force"
  [[ -f ${AMP_POLICY_RC_D} ]] || fail "the machine's policy-rc.d was removed"
  expect_rc "${before}" "$(<"${AMP_POLICY_RC_D}")" "the machine's policy-rc.d is unchanged"
}

test_removes_its_policy_when_interrupted() {
  local signal expected
  for signal in TERM INT HUP; do
    case ${signal} in
      TERM) expected=143 ;;
      INT) expected=130 ;;
      *) expected=129 ;;
    esac
    : >"${state}/installed"  # the stub goes on installing after it sent the signal
    STUB_APT_SIGNAL=${signal} install_deps
    expect_rc "${expected}" "${last_rc}" "install-deps with SIG${signal} during apt-get install"
    if [[ -e ${AMP_POLICY_RC_D} ]]; then fail "the policy-rc.d it wrote survived SIG${signal}"; fi
  done
}

test_replaces_its_own_policy_left_by_a_killed_run() {
  printf '#!/bin/sh\n# Written by amp scripts/install-deps for the length of an install.\nexit 101\n' \
    >"${AMP_POLICY_RC_D}"
  chmod +x "${AMP_POLICY_RC_D}"
  install_deps
  expect_rc 0 "${last_rc}" "install-deps with a policy-rc.d of its own left behind"
  expect_contains "${last_out}" "replacing ${AMP_POLICY_RC_D} left by an interrupted run" "it says so"
  expect_contains "$(<"${log_file}")" "policy-rc.d cron.service: 0" \
    "its policy, not the stale one, was in force"
  if [[ -e ${AMP_POLICY_RC_D} ]]; then fail "the stale policy-rc.d is still there"; fi
}

test_refuses_an_unknown_argument() {
  install_deps --benchmark
  expect_rc 2 "${last_rc}" "install-deps --benchmark"
  expect_contains "${last_err}" "unknown argument: --benchmark" "the message"
  [[ ! -s ${log_file} ]] || fail "apt-get was called: $(<"${log_file}")"
}

run_test "$@"
