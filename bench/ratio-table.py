#!/usr/bin/env python3
"""Print `NAME RATE` lines from files as a Markdown table of ratios.

usage: ratio-table.py BASELINE_PREFIX FILE...
The baseline is the best rate among names starting with BASELINE_PREFIX
(the backend's measured limit).
"""
import sys

prefix, files = sys.argv[1], sys.argv[2:]
rates = {}
for f in files:
    for line in open(f):
        name, rate = line.split()
        rates[name] = float(rate)
limit_name = max((k for k in rates if k.startswith(prefix)), key=rates.get)
limit = rates[limit_name]
print(f"| benchmark | pairs per second | ratio to backend limit ({limit_name}) |")
print("|---|---:|---:|")
for k, v in rates.items():
    print(f"| {k} | {v:,.0f} | {v / limit:.2f} |")
