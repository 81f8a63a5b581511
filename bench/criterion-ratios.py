#!/usr/bin/env python3
"""Print a criterion group's throughput as ratios to one of its benchmarks.

usage: criterion-ratios.py GROUP BASELINE_ID
Reads target/criterion/GROUP/*/new/{estimates,benchmark}.json (criterion's
own output from the run just made) and prints a Markdown table.
"""
import json, pathlib, sys

group, baseline = sys.argv[1], sys.argv[2]
root = pathlib.Path("target/criterion") / group
rows = {}
for est in root.glob("**/new/estimates.json"):
    bench = json.loads((est.parent / "benchmark.json").read_text())
    elements = (bench.get("throughput") or {}).get("Elements", 1)
    mean_ns = json.loads(est.read_text())["mean"]["point_estimate"]
    rows[bench["full_id"].removeprefix(group + "/")] = elements / (mean_ns / 1e9)
if baseline not in rows:
    sys.exit(f"no baseline {baseline!r} among {sorted(rows)}")
base = rows[baseline]
print(f"| benchmark | per second | ratio to {baseline} |")
print("|---|---:|---:|")
def order(k):
    name, _, n = k.partition("/")
    return (k != baseline, name, int(n) if n.isdigit() else 0)
for k in sorted(rows, key=order):
    print(f"| {k} | {rows[k]:,.0f} | {rows[k] / base:.1f}x |")
