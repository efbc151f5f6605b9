#!/usr/bin/env bash
# Where the router's CPU goes, now against an older commit under the same load: py-spy samples both router processes
# (100 Hz) through one `bench/router_bench.py` run, then bench/profile_files.py tables the samples per source file
# and per 1k requests. Usage: bench/profile_router.sh [COMMIT] [OUT_DIR]   (defaults: 763aa3d, /tmp/duplex-profile)
set -euo pipefail
cd "$(dirname "$0")/.."
at=${1:-763aa3d}
out=${2:-/tmp/duplex-profile}
spy=${PY_SPY:-$HOME/.cache/duplex/py-spy/bin/py-spy}
if [[ ! -x $spy ]]; then
  echo "==> installing py-spy into $(dirname "$(dirname "$spy")")"
  python3 -m venv "$(dirname "$(dirname "$spy")")" && "$(dirname "$spy")/pip" -q install py-spy
fi
rm -rf "$out" && mkdir -p "$out"
cmd=(.venv/bin/python bench/router_bench.py --contenders duplex --duplex-at "$at" --modes non-stream --clients 16
     --rounds 4 --duration 8 --warmup 1 --latency-rounds 0 --skip-store --skip-history --no-install --out "$out/bench")
echo "==> ${cmd[*]}"
"${cmd[@]}" >"$out/bench.log" 2>&1 &
bench=$!
line=""
for _ in $(seq 1 120); do
  line=$(grep -m1 "routers " "$out/bench.log" || true)
  [[ -n $line ]] && break
  sleep 1
done
[[ -n $line ]] || { cat "$out/bench.log"; echo "the benchmark never started its routers" >&2; exit 1; }
now=$(sed -n 's/.*duplex http[^ ]* (pid \([0-9]*\)).*/\1/p' <<<"$line")
old=$(sed -n "s/.*duplex@$at http[^ ]* (pid \([0-9]*\)).*/\1/p" <<<"$line")
echo "==> sampling routers: now pid $now, $at pid $old"
"$spy" record --pid "$now" --rate 100 --nonblocking --format raw -o "$out/now.txt" >/dev/null 2>&1 &
"$spy" record --pid "$old" --rate 100 --nonblocking --format raw -o "$out/old.txt" >/dev/null 2>&1 &
wait $bench
sleep 3
.venv/bin/python bench/profile_files.py "$out/now.txt" "$out/old.txt" "$out/bench.json" "$at"
