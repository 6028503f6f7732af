#!/usr/bin/env python3
"""Turns kvcache_bench JSON into PNG charts.

latency_vs_context.png: per-token latency with the cache and recomputing, by context length
    (median, bars from min to max).
bandwidth_fraction.png: decode attention's fraction of the streaming-read bandwidth measured in
    the same run, by layout, element type, batch and context (hatched: the K/V fit the LLC).
storage_types.png: every layout x storage type: prefill GFLOP/s at the prefill benchmark's
    type comparison (512 queries after 1024), and decode's fraction of the streaming read at the
    longest context of element_types, GQA and MHA (median; the machine's FMA peak is not drawn).
compress_quality.png: quality against memory for each eviction policy (07_compress --json):
    perplexity increase and mean KL divergence from the full cache, and recall accuracy (with
    the full cache's as a line), against the bytes held.
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


def save(plt, fig, out_dir, name):
    """Writes the figure as out_dir/name, closes it, and returns the path."""
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def rows_of(data, benchmark):
    return [r for r in data["results"] if r["benchmark"] == benchmark]


def latency_chart(plt, data, out_dir):
    rows = rows_of(data, "generation")
    if not rows:
        return None
    rows.sort(key=lambda r: r["params"]["context"])
    contexts = [r["params"]["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, style in (("recompute_ms_per_token", "recompute every step (no cache)", "o-"),
                              ("cached_ms_per_token", "with kvcache (paged, fp32)", "s-")):
        median = [r["metrics"][key] for r in rows]
        low = [m - r["metrics"].get(key + "_min", m) for m, r in zip(median, rows)]
        high = [r["metrics"].get(key + "_max", m) - m for m, r in zip(median, rows)]
        ax.errorbar(contexts, median, yerr=[low, high], fmt=style, capsize=3, label=label)
    for r in rows:
        ax.annotate(f'-{100 * r["metrics"]["latency_reduction"]:.1f}%',
                    (r["params"]["context"], r["metrics"]["cached_ms_per_token"]),
                    textcoords="offset points", xytext=(0, -14), ha="center", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(contexts)
    ax.set_xticklabels([str(c) for c in contexts])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("per-token latency (ms, median; bars min-max)")
    model = rows[0]["params"].get("model", "")
    ax.set_title(f"Generation, 02_generate model ({model})", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return save(plt, fig, out_dir, "latency_vs_context.png")


def bandwidth_chart(plt, data, out_dir):
    rows = rows_of(data, "decode_bandwidth")
    if not rows:
        return None
    layouts = sorted({r["params"]["layout"] for r in rows}, key=["contiguous", "paged", "sliding_window"].index)
    shapes = sorted({(r["params"]["batch"], r["params"]["context"]) for r in rows})
    elements = ["fp32", "fp16"]
    fig, axes = plt.subplots(1, len(layouts), figsize=(5 * len(layouts), 4.8), sharey=True, squeeze=False)
    width = 0.4
    for ax, layout in zip(axes[0], layouts):
        for e, element in enumerate(elements):
            xs, ys, fits = [], [], []
            for i, (batch, context) in enumerate(shapes):
                match = [r for r in rows if r["params"]["layout"] == layout and r["params"]["element"] == element
                         and r["params"]["batch"] == batch and r["params"]["context"] == context]
                if match:
                    xs.append(i + (e - 0.5) * width)
                    ys.append(match[0]["metrics"]["fraction_of_measured_bandwidth"])
                    fits.append(match[0]["metrics"].get("fits_in_llc", False))
            bars = ax.bar(xs, ys, width, color=f"C{e}")
            for bar, fit in zip(bars, fits):
                if fit:
                    bar.set_hatch("//")
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        ax.axhline(0.7, color="red", linestyle=":", linewidth=1)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([f"b{b}\nc{c}" for b, c in shapes], fontsize=7)
        ax.set_title(layout)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("fraction of measured read bandwidth")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    handles = [Patch(color=f"C{e}", label=element) for e, element in enumerate(elements)]
    handles += [Patch(facecolor="white", edgecolor="black", hatch="//", label="K/V fit the LLC"),
                Line2D([], [], color="red", linestyle=":", label="target 0.7")]
    axes[0][0].legend(handles=handles, fontsize=8)
    title = ("Decode attention: (K/V + Q/O bytes) / time over the streaming-read bandwidth "
             "probed in the same run before each layout/element group")
    fig.suptitle(title, fontsize=9)
    return save(plt, fig, out_dir, "bandwidth_fraction.png")


def storage_type_chart(plt, data, out_dir):
    prefill = [r for r in rows_of(data, "prefill") if r["params"].get("types_compared")]
    decode = rows_of(data, "element_types")
    if not prefill and not decode:
        return None
    layout_order = ["contiguous", "paged", "sliding_window"]
    panels = []
    if prefill:
        panels.append(("prefill, 32q/8kv/d128: GFLOP/s", prefill, "gflop_per_s"))
    if decode:
        longest = max(r["params"]["context"] for r in decode)
        for heads in sorted({r["params"]["heads"] for r in decode}):
            rows = [r for r in decode if r["params"]["heads"] == heads and r["params"]["context"] == longest]
            panels.append((f"decode, {heads}, context {longest}: fraction of the streaming read", rows,
                           "fraction_of_measured_bandwidth"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.8), squeeze=False)
    for ax, (title, rows, metric) in zip(axes[0], panels):
        elements = []
        for r in rows:
            if r["params"]["element"] not in elements:
                elements.append(r["params"]["element"])
        layouts = sorted({r["params"]["layout"] for r in rows}, key=layout_order.index)
        width = 0.8 / len(layouts)
        for l, layout in enumerate(layouts):
            xs, ys = [], []
            for i, element in enumerate(elements):
                match = [r for r in rows if r["params"]["layout"] == layout and r["params"]["element"] == element]
                if match:
                    xs.append(i + (l - (len(layouts) - 1) / 2) * width)
                    ys.append(match[0]["metrics"][metric])
            ax.bar(xs, ys, width, color=f"C{l}", label=layout)
        ax.set_xticks(range(len(elements)))
        ax.set_xticklabels(elements, fontsize=7, rotation=30)
        ax.set_title(title, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("Every layout and storage type on the CPU backend (kvcache_bench --only prefill,element_types)",
                 fontsize=9)
    return save(plt, fig, out_dir, "storage_types.png")


def compress_chart(plt, data, out_dir):
    rows = [r for r in rows_of(data, "compress_quality") if r["params"]["policy"] != "none"]
    if not rows:
        return None
    policies = list(dict.fromkeys(r["params"]["policy"] for r in rows))
    def recall_percent(r):
        total = r["metrics"].get("recall_total", 0)
        return 100 * r["metrics"].get("recall_right", 0) / total if total else float("nan")

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for i, policy in enumerate(policies):
        mine = sorted((r for r in rows if r["params"]["policy"] == policy), key=lambda r: r["metrics"]["bytes_vs_full"])
        xs = [100 * r["metrics"]["bytes_vs_full"] for r in mine]
        axes[0].plot(xs, [100 * r["metrics"]["perplexity_vs_full"] for r in mine], "o-", color=f"C{i}", label=policy)
        axes[1].plot(xs, [r["metrics"]["kl_mean"] for r in mine], "o-", color=f"C{i}", label=policy)
        axes[2].plot(xs, [recall_percent(r) for r in mine], "o-", color=f"C{i}", label=policy)
    full = [r for r in rows_of(data, "compress_quality") if r["params"]["policy"] == "none"]
    if full:
        axes[2].axhline(recall_percent(full[0]), color="black", linestyle="--", linewidth=0.8, label="full cache")
        axes[2].legend(fontsize=8)
    axes[0].set_ylabel("perplexity vs the full cache (%)")
    axes[1].set_ylabel("mean KL(full || policy) per token (nats)")
    axes[1].set_yscale("log")
    axes[2].set_ylabel("recall queries answered (%)")
    for ax in axes:
        ax.set_xlabel("bytes held (% of the full cache, pool accounting)")
        ax.grid(True, which="both", alpha=0.3)
        ax.axhline(0, color="black", linewidth=0.6)
    axes[0].legend()
    machine = data["machine"]
    fig.suptitle(f'Eviction policies, {machine.get("model", "")} ({machine.get("windows", "?")} held-out windows)',
                 fontsize=9)
    return save(plt, fig, out_dir, "compress_quality.png")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json_file")
    parser.add_argument("--out", default=".", help="folder for the PNG files")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = load(args.json_file)
    os.makedirs(args.out, exist_ok=True)
    for path in (latency_chart(plt, data, args.out), bandwidth_chart(plt, data, args.out),
                 storage_type_chart(plt, data, args.out), compress_chart(plt, data, args.out)):
        if path:
            print(f"plot.py: wrote {path}")


if __name__ == "__main__":
    main()
