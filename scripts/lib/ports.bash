# shellcheck shell=bash
# TCP ports on this machine, from /proc and bash's /dev/tcp (no tool needed): sourced by
# scripts/run, scripts/nats-cluster, scripts/check-fresh and tests/scripts.

# Prints the local port of every TCP socket (any state, IPv4 and IPv6), one a line.
ports_in_use() {
  local file _ local_address _rest
  for file in /proc/net/tcp /proc/net/tcp6; do
    if [[ ! -r ${file} ]]; then continue; fi
    while read -r _ local_address _rest; do
      if [[ ${local_address} == *:* ]]; then echo $((16#${local_address##*:})); fi
    done <"${file}"
  done
}

# Prints $1 distinct free ports below the kernel's ephemeral range (so that outgoing
# connections cannot take them between now and their use), separated by spaces.
choose_free_ports() {
  local count=$1 low=20000 high=32767 port eph_low _ used
  local -A taken=()
  local -a chosen=()
  if [[ -r /proc/sys/net/ipv4/ip_local_port_range ]]; then
    read -r eph_low _ </proc/sys/net/ipv4/ip_local_port_range
    if ((eph_low - 1 < high)); then high=$((eph_low - 1)); fi
    if ((high - low < 1000)); then low=$((high - 1000)); fi
  fi
  used=$(ports_in_use)
  while read -r port; do
    if [[ -n ${port} ]]; then taken[${port}]=1; fi
  done <<<"${used}"
  while ((${#chosen[@]} < count)); do
    port=$((low + (RANDOM * 32768 + RANDOM) % (high - low + 1)))
    if [[ -n ${taken[${port}]:-} ]]; then continue; fi
    taken[${port}]=1
    chosen+=("${port}")
  done
  echo "${chosen[@]}"
}

# True when something accepts TCP connections on host $1, port $2.
port_answers() {
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

# Connects to 127.0.0.1, port $1, sends $2 (if given) and prints the first line that comes
# back within 5 s (without its CR); prints nothing when nothing answers.
first_line_from() {
  (
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 0
    if [[ -n ${2:-} ]]; then printf '%s' "$2" >&3; fi
    IFS= read -r -t 5 line <&3 || exit 0
    printf '%s' "${line%$'\r'}"
  ) 2>/dev/null
}

# Prints "NAME (pid N)" for the process listening on TCP port $1, or nothing when it
# cannot be told (no such listener, another network namespace, no permission).
port_holder() {
  local port=$1 file _ local_address _remote state inode_field _rest inode="" fd link pid comm
  local hex
  hex=$(printf '%04X' "${port}")
  for file in /proc/net/tcp /proc/net/tcp6; do
    if [[ ! -r ${file} ]]; then continue; fi
    # Fields: sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid
    # timeout inode ...; state 0A is LISTEN.
    while read -r _ local_address _remote state _ _ _ _ _ inode_field _rest; do
      if [[ ${state} == 0A && ${local_address##*:} == "${hex}" ]]; then
        inode=${inode_field}
        break 2
      fi
    done <"${file}"
  done
  if [[ -z ${inode} || ${inode} == 0 ]]; then return 0; fi
  for fd in /proc/[0-9]*/fd/*; do
    link=$(readlink "${fd}" 2>/dev/null) || continue
    if [[ ${link} == "socket:[${inode}]" ]]; then
      pid=${fd#/proc/}
      pid=${pid%%/*}
      comm=$(cat "/proc/${pid}/comm" 2>/dev/null) || comm="?"
      echo "${comm} (pid ${pid})"
      return 0
    fi
  done
}
