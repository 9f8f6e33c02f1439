# Run a list of tune slices one after another within one overall deadline, in the background, so
# that they outlast one device call's 10 minutes (a process in a session of its own runs on between
# calls while the machine stays warm: .library/device/README.md, Notes). Unlike tune-chain.sh, each
# slice has its own tune arguments, and each gets the time left of the lane's deadline, not a
# fixed share. Two lanes can split a machine's GPUs between them (CUDA_VISIBLE_DEVICES, taskset).
#
#   CUDA_VISIBLE_DEVICES=0,1 setsid nohup taskset -c 0-31 bash benchmarks/device/tune-lane.sh \
#       LANE TOTAL_S PLAN >runs/LANE.out 2>&1 </dev/null &
#   # this call and the next ones: wait, then bring back what is finished
#   while [ ! -f runs/pack/LANE.done ] && [ $SECONDS -lt 560 ]; do sleep 5; done; tar -C runs -czf $OUT/pack.tgz pack
#
# PLAN has one slice a line: its name (runs/NAME/) and then its `orchestrate tune` arguments,
# split at blanks (write an empty value as --bases=). Blank lines and lines starting with # are
# skipped. A slice starts only with at least MIN_SLICE_S (default 120) seconds left. Each slice
# writes, in runs/pack/, its log, its wall time and its packed output (tune-slice.sh);
# runs/pack/LANE.done marks the lane's end, and runs/pack/LANE.lane lists each slice's start.
set -u
lane=$1; total=$2; plan=$3
min_slice=${MIN_SLICE_S:-120}
export OUT=$PWD/runs/pack
mkdir -p "$OUT"
rm -f "$OUT/$lane.done"
end=$((SECONDS + total))
while read -ra words; do
    [ ${#words[@]} -eq 0 ] && continue
    case ${words[0]} in \#*) continue ;; esac
    left=$((end - SECONDS))
    if [ "$left" -lt "$min_slice" ]; then
        echo "$(date +%T) skip ${words[0]}: ${left} s left" >>"$OUT/$lane.lane"
        continue
    fi
    echo "$(date +%T) start ${words[0]} with ${left} s (GPUs ${CUDA_VISIBLE_DEVICES:-all})" >>"$OUT/$lane.lane"
    bash benchmarks/device/tune-slice.sh "$left" "${words[@]}" </dev/null >"$OUT/${words[0]}.out" 2>&1
done <"$plan"
touch "$OUT/$lane.done"
