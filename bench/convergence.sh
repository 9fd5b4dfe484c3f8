#!/usr/bin/env bash
# Issue 17 item 6: DDP convergence under ferrocoll's comm hooks, 4 ranks,
# every hook with and without error feedback plus uncompressed
# (bench/convergence.py; its docstring says what is measured).
#
#   bench/convergence.sh local   [TASK...]   # ferrocoll run -n 4 on this host
#   bench/convergence.sh cluster [TASK...]   # 2 hosts x 2 ranks of a bench/cluster.sh cluster
#
# TASK: digits (needs scikit-learn in $PYTHON's environment), lm (default:
# both). PYTHON: the interpreter with ferrocoll, torch (default python3);
# FERROCOLL: the binary (default target/release/ferrocoll); HOSTS: the
# cluster's hosts (default hkh0:2,hkh1:2); CONVERGENCE_ARGS: more
# arguments for convergence.py. Prints the markdown table of each task
# with the load (uptime) before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
bin=${FERROCOLL:-target/release/ferrocoll}
mode=${1:-local}
shift || true
tasks=("$@")
[ ${#tasks[@]} -gt 0 ] || tasks=(digits lm)
case "$mode" in
local) launch=("$bin" run -n 4 --) ;;
cluster) launch=("$bin" run --hosts "${HOSTS:-hkh0:2,hkh1:2}" --agent "bench/cluster.sh exec" --) ;;
*)
    echo "usage: bench/convergence.sh local|cluster [digits] [lm]" >&2
    exit 2
    ;;
esac
read -r -a extra <<<"${CONVERGENCE_ARGS:-}"
for task in "${tasks[@]}"; do
    echo "# load before: $(uptime)"
    echo "# command: ${launch[*]} $py bench/convergence.py --task $task ${extra[*]}"
    "${launch[@]}" "$py" bench/convergence.py --task "$task" "${extra[@]}" | sed -u 's/^\[0\] //'
    echo "# load after: $(uptime)"
done
