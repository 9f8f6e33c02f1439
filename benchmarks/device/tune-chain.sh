# Tune seed cells one after another, each as its own tune-slice.sh slice, in the background, so
# that the chain outlasts one device call's 10 minutes (a process in a session of its own runs on
# between calls while the machine stays warm: .library/device/README.md, Notes).
#
#   setsid nohup bash benchmarks/device/tune-chain.sh PREFIX DEADLINE_S 'CELL ...' TUNE_ARGS... \
#       >runs/chain.log 2>&1 </dev/null &
#   # this call and the next ones: wait, then bring back what is finished
#   while [ ! -f runs/pack/chain.done ] && [ $SECONDS -lt 560 ]; do sleep 5; done; tar -C runs -czf $OUT/pack.tgz pack
#
# CELL is MODEL/bsN (the tune's --only becomes '*/CELL/*'); each slice gets DEADLINE_S seconds and
# writes runs/PREFIX-MODEL-bsN/ and, in runs/pack/, its log, its wall time and its packed output
# (tune-slice.sh). runs/pack/chain.done marks the end. Each slice sources `.devcarry/setup.sh`
# where Ray is not importable yet (../shared/device/README.md).
set -u
prefix=$1; deadline=$2; cells=$3; shift 3
export OUT=$PWD/runs/pack
mkdir -p "$OUT"
rm -f "$OUT/chain.done"
for c in $cells; do
    n=$prefix-${c/\//-}
    bash benchmarks/device/tune-slice.sh "$deadline" "$n" "$@" --only "*/$c/*" >"$OUT/$n.out" 2>&1
done
touch "$OUT/chain.done"
