#!/usr/bin/env bash
# A test cluster of network namespaces on this machine: H "hosts", each a
# network namespace with its own address, its own FERROCOLL_HOST_ID and its
# own /dev/shm (a private mount namespace), joined through veth pairs to a
# bridge in a "switch" namespace, every host's link shaped with tbf to a
# given rate in both directions (uplink on the host's side, downlink on the
# switch's side). Root only.
#
#   bench/cluster.sh up    [--name N] [--hosts H] [--rate R] [--subnet S] [--pin]
#   bench/cluster.sh down  [--name N]
#   bench/cluster.sh exec  HOST CMD [ARGS...]   # run CMD inside HOST
#   bench/cluster.sh hosts [--name N]           # the host names, one per line
#   bench/cluster.sh shape HOST R               # change HOST's link rate now
#   bench/cluster.sh link  HOST up|down         # take HOST's link down / up
#
# Hosts are named N h0, N h1, ... (e.g. fch0, fch1 for the default name "fc"),
# with addresses 198.18.S.1, 198.18.S.2, ... (198.18.0.0/15 is reserved for
# benchmarking, RFC 2544); every host resolves every other host's name (its
# own /etc/hosts). R is a tc rate (1gbit, 500mbit, 5gbit) or "none".
#
# --pin gives host i the CPU i (modulo this machine's CPUs): `exec` runs
# its commands under taskset, so every rank, progress worker and system
# call of a host computes on that host's core, as on a real machine,
# instead of the "hosts" taking turns on all of this machine's cores (where
# one host's communication takes CPU time from another host's
# computation, which no model of separate hosts can see). Without it the
# hosts share every CPU.
#
# `exec` is the agent `ferrocoll run --hosts` uses:
#   ferrocoll run --hosts fch0:2,fch1:2 --agent "bench/cluster.sh exec" -- prog
# A script rather than a `ferrocoll cluster` subcommand: it is root-only test
# equipment made of ip/tc/unshare commands, and a reader can see (and a test
# or a benchmark can call) each step; the library has no business creating
# namespaces.
#
# `up` removes what it made when a step fails (a trap); `down` removes
# everything of the cluster and is safe to run twice.
set -euo pipefail

STATE=/run/ferrocoll-cluster

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

need_root() {
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces and tc); run it as root, e.g. with sudo"
    command -v ip >/dev/null || die "the ip command (iproute2) is not installed"
    command -v tc >/dev/null || die "the tc command (iproute2) is not installed"
    command -v nsenter >/dev/null || die "nsenter (util-linux) is not installed"
    ip netns list >/dev/null 2>&1 || die "ip netns is unavailable here: $(ip netns list 2>&1 | head -1)"
}

# tbf needs a bucket of at least one full (GSO) packet, and about 2 ms of
# traffic at the rate so that the kernel's timer granularity does not cap it.
burst_of() {
    local rate=$1 num unit bits
    num=${rate%%[a-zA-Z]*}
    unit=${rate#"$num"}
    case "${unit,,}" in
    gbit) bits=$((num * 1000000000)) ;;
    mbit) bits=$((num * 1000000)) ;;
    kbit) bits=$((num * 1000)) ;;
    bit | "") bits=$num ;;
    *) die "rate '$rate' is not understood: give it as 500mbit, 1gbit, 5gbit or none" ;;
    esac
    [ "$bits" -gt 0 ] || die "rate '$rate' must be more than 0 (or none)"
    local b=$((bits / 8 / 500))
    [ "$b" -lt 131072 ] && b=131072
    echo "$b"
}

# shape NETNS DEV RATE: replace DEV's root qdisc by tbf at RATE (none: the
# default qdisc).
shape_dev() {
    local ns=$1 dev=$2 rate=$3
    if [ "$rate" = none ]; then
        ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
        return
    fi
    local burst
    burst=$(burst_of "$rate")
    ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
}

parse_common() {
    NAME=fc
    HOSTS=2
    RATE=1gbit
    SUBNET=0
    PIN=0
    while [ $# -gt 0 ]; do
        case "$1" in
        --pin) PIN=1; shift ;;
        --name) NAME=$2; shift 2 ;;
        --hosts) HOSTS=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --subnet) SUBNET=$2; shift 2 ;;
        *) die "unknown option '$1' (see the top of $0)" ;;
        esac
    done
    [[ "$NAME" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "--name '$NAME' must be 1-8 lower-case letters and digits, starting with a letter"
    [[ "$HOSTS" =~ ^[0-9]+$ ]] && [ "$HOSTS" -ge 1 ] && [ "$HOSTS" -le 200 ] || die "--hosts '$HOSTS' must be 1..200"
    [[ "$SUBNET" =~ ^[0-9]+$ ]] && [ "$SUBNET" -le 255 ] || die "--subnet '$SUBNET' must be 0..255"
}

cmd_up() {
    parse_common "$@"
    need_root
    [ "$RATE" = none ] || burst_of "$RATE" >/dev/null
    [ -e "$STATE/$NAME" ] && die "cluster '$NAME' exists already; run '$0 down --name $NAME' first"
    mkdir -p "$STATE/$NAME"
    # Anything that fails from here on removes what was made.
    trap 'echo "cluster.sh: setting up cluster $NAME failed; removing it" >&2; cmd_down --name "$NAME"' ERR
    echo "$RATE" >"$STATE/$NAME/rate"
    [ "$PIN" = 1 ] && touch "$STATE/$NAME/pin"
    local sw="${NAME}sw"
    ip netns add "$sw"
    echo "$sw" >"$STATE/$NAME/switch"
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    local hostsfile="$STATE/$NAME/hosts"
    printf '127.0.0.1 localhost\n' >"$hostsfile"
    for i in $(seq 0 $((HOSTS - 1))); do
        printf '198.18.%d.%d %sh%d\n' "$SUBNET" $((i + 1)) "$NAME" "$i" >>"$hostsfile"
    done
    for i in $(seq 0 $((HOSTS - 1))); do
        local h="${NAME}h$i" addr="198.18.$SUBNET.$((i + 1))"
        ip netns add "$h"
        echo "$h" >>"$STATE/$NAME/list"
        ip link add "$h-up" type veth peer name "$h-sw"
        ip link set "$h-up" netns "$h"
        ip link set "$h-sw" netns "$sw"
        ip -n "$h" link set "$h-up" name eth0
        ip -n "$h" addr add "$addr/24" dev eth0
        ip -n "$h" link set lo up
        ip -n "$h" link set eth0 up
        ip -n "$sw" link set "$h-sw" master br0
        ip -n "$sw" link set "$h-sw" up
        shape_dev "$h" eth0 "$RATE"
        shape_dev "$sw" "$h-sw" "$RATE"
        # A mount namespace of its own, kept alive by a bind mount of it:
        # a private /dev/shm and this cluster's /etc/hosts.
        touch "$STATE/$NAME/$h.mnt"
        unshare --mount="$STATE/$NAME/$h.mnt" --propagation private \
            sh -c "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mount --bind '$hostsfile' /etc/hosts"
        ln -sfn "$STATE/$NAME" "$STATE/host-$h"
    done
    trap - ERR
    cat "$STATE/$NAME/list"
}

cmd_down() {
    NAME=fc
    while [ $# -gt 0 ]; do
        case "$1" in
        --name) NAME=$2; shift 2 ;;
        *) die "unknown option '$1'" ;;
        esac
    done
    need_root
    local dir="$STATE/$NAME"
    # Hosts first (their veth ends go with them), then the switch.
    for h in $(cat "$dir/list" 2>/dev/null) $(ip netns list | awk '{print $1}' | grep -E "^${NAME}h[0-9]+$" || true); do
        # Ranks still running inside would keep the namespace's sockets.
        ip netns pids "$h" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        umount "$dir/$h.mnt" 2>/dev/null || true
        rm -f "$dir/$h.mnt" "$STATE/host-$h"
        ip netns del "$h" 2>/dev/null || true
    done
    ip netns del "${NAME}sw" 2>/dev/null || true
    rm -rf "$dir"
}

# The cluster directory of HOST.
dir_of() {
    local d="$STATE/host-$1"
    [ -e "$d/$1.mnt" ] || die "no cluster host '$1' (bench/cluster.sh up makes them; 'hosts' lists them)"
    echo "$d"
}

cmd_exec() {
    [ $# -ge 2 ] || die "usage: $0 exec HOST CMD [ARGS...]"
    local h=$1 d
    shift
    d=$(dir_of "$h")
    # The hosts share this machine's CPUs: a rank pinned to "its" core
    # (FERROCOLL_BIND=auto pins when a host's ranks fit its cores) would
    # share that core with the ranks the other hosts pin there too.
    local pin=()
    if [ -e "$d/pin" ]; then
        # Host i (its line in the list, from 0) computes on CPU i.
        local i ncpu
        i=$(($(grep -n -x "$h" "$d/list" | cut -d: -f1) - 1))
        ncpu=$(nproc --all)
        pin=(taskset -c $((i % ncpu)))
    fi
    exec nsenter --net="/run/netns/$h" --mount="$d/$h.mnt" --wd="$PWD" -- \
        "${pin[@]}" env FERROCOLL_HOST_ID="$h" FERROCOLL_BIND="${FERROCOLL_BIND:-none}" "$@"
}

cmd_hosts() {
    parse_common "$@"
    cat "$STATE/$NAME/list" 2>/dev/null || die "no cluster '$NAME'"
}

cmd_shape() {
    [ $# = 2 ] || die "usage: $0 shape HOST RATE"
    need_root
    local h=$1 d
    d=$(dir_of "$h")
    shape_dev "$h" eth0 "$2"
    shape_dev "$(cat "$d/switch")" "$h-sw" "$2"
}

cmd_link() {
    [ $# = 2 ] && { [ "$2" = up ] || [ "$2" = down ]; } || die "usage: $0 link HOST up|down"
    need_root
    local h=$1 d
    d=$(dir_of "$h")
    # The switch's side: the host keeps its address and routes, as when a
    # cable or a switch port fails.
    ip -n "$(cat "$d/switch")" link set "$h-sw" "$2"
}

case "${1:-}" in
up | down | exec | hosts | shape | link)
    c=$1
    shift
    "cmd_$c" "$@"
    ;;
*) die "usage: $0 up|down|exec|hosts|shape|link ... (see the top of the script)" ;;
esac
