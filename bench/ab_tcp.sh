#!/usr/bin/env bash
# bench/ab.sh over TCP with 2 ranks (issue 20 item 4's before/after was run with this name,
# when it was a copy of ab.sh printing busbw; ab.sh prints time and busbw since):
# Usage: bash bench/ab_tcp.sh "CMD_A" "CMD_B" COLL MIN MAX REPS ITERS
#   e.g. flock /tmp/ferrocoll-bench.lock bash bench/ab_tcp.sh /tmp/fc-base /tmp/fc-new bcast 1M 64M 3 10
here=$(cd "$(dirname "$0")" && pwd)
ITERS=$7 exec bash "$here/ab.sh" "$1" "$2" "$3" tcp 2 "$4" "$5" "$6"
