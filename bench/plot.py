#!/usr/bin/env python3
"""Turns kvcache_bench JSON into PNG charts.

latency_vs_context.png: per-token latency with the cache and recomputing, by context length.
bandwidth_fraction.png: decode attention's fraction of the measured read bandwidth, by configuration.
"""
import argparse
import json
import os
import sys


def load(path):
    with open(path) as f:
        data = json.load(f)
    if "results" not in data or "machine" not in data:
        sys.exit(f"plot.py: {path} is not kvcache_bench output (no 'machine'/'results')")
    return data


def latency_chart(plt, data, out_dir):
    rows = [r for r in data["results"] if r["benchmark"] == "generation"]
    if not rows:
        return None
    rows.sort(key=lambda r: r["params"]["context"])
    contexts = [r["params"]["context"] for r in rows]
    cached = [r["metrics"]["cached_ms_per_token"] for r in rows]
    recompute = [r["metrics"]["recompute_ms_per_token"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(contexts, recompute, "o-", label="recompute every step")
    ax.plot(contexts, cached, "s-", label="with kvcache")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("per-token latency (ms, median)")
    ax.set_title("Generation: per-token latency")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path = os.path.join(out_dir, "latency_vs_context.png")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def bandwidth_chart(plt, data, out_dir):
    rows = [r for r in data["results"] if r["benchmark"] == "decode_bandwidth"]
    if not rows:
        return None
    labels, values = [], []
    for r in rows:
        p = r["params"]
        labels.append(f'{p.get("layout")}/{p.get("element")} b{p.get("batch")} c{p.get("context")}')
        values.append(r["metrics"]["fraction_of_measured_bandwidth"])
    fig, ax = plt.subplots(figsize=(max(7, len(rows) * 0.35), 5))
    ax.bar(range(len(values)), values)
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_ylabel("fraction of measured read bandwidth")
    ax.set_title("Decode attention: bytes moved / time vs streaming read")
    path = os.path.join(out_dir, "bandwidth_fraction.png")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("json_file")
    parser.add_argument("--out", default=".", help="folder for the PNG files")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = load(args.json_file)
    os.makedirs(args.out, exist_ok=True)
    for path in (latency_chart(plt, data, args.out), bandwidth_chart(plt, data, args.out)):
        if path:
            print(f"plot.py: wrote {path}")


if __name__ == "__main__":
    main()
