# Sourced by the cluster benchmarks (cluster_bench.sh, catchup_bench.sh,
# failover_bench.sh): what each needs to start nodes on loopback and find the leader.
# Expects BIN (the directory of the release binaries).

# A TCP port free on 127.0.0.1 now.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The --peers of a 3-node loopback cluster, on ports free now.
loopback_peers() {
  echo "1=127.0.0.1:$(free_port),2=127.0.0.1:$(free_port),3=127.0.0.1:$(free_port)"
}

# first_to_declare TOPIC ADDR...: prints the position (from 1) of the first address whose
# node creates TOPIC, one partition: the leader (followers answer NOT_LEADER); nothing
# if none does.
first_to_declare() {
  local topic=$1 i=0 addr
  shift
  for addr in "$@"; do
    i=$((i + 1))
    if "$BIN/mortarctl" --broker "$addr" --timeout 2s topics create "$topic" \
      --partitions 1 >/dev/null 2>&1; then
      echo "$i"
      return
    fi
  done
}
