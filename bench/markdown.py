#!/usr/bin/env python3
"""Prints kvcache_bench JSON as Markdown tables (medians with [min, max]), for docs/performance.md.

usage: bench/markdown.py results.json > tables.md   (standard library only)
"""
import json
import sys


def fmt(value, digits=3):
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def spread(m, key, digits=3):
    """median [min, max] of a metric with _min/_max siblings."""
    text = fmt(m[key], digits)
    if key + "_min" in m and key + "_max" in m:
        text += f" [{fmt(m[key + '_min'], digits)}, {fmt(m[key + '_max'], digits)}]"
    return text


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        data = json.load(f)
    results = data["results"]

    def of(name):
        return [r for r in results if r["benchmark"] == name]

    rows = []
    for r in of("generation"):
        p, m = r["params"], r["metrics"]
        rows.append([str(p["context"]), spread(m, "recompute_ms_per_token"), spread(m, "cached_ms_per_token"),
                     f'{100 * m["latency_reduction"]:.1f}%', fmt(m["throughput_ratio"]),
                     fmt(m["tokens_identical"]), fmt(m["max_logit_diff"], 2)])
    if rows:
        print("### generation\n")
        print(table(["context", "recompute ms/token", "cached ms/token", "latency_reduction", "throughput_ratio",
                     "tokens_identical", "max logit diff"], rows))

    rows = []
    for r in of("decode_bandwidth"):
        p, m = r["params"], r["metrics"]
        rows.append([p["layout"], p["element"], str(p["batch"]), str(p["context"]), spread(m, "ms_per_call"),
                     spread(m, "gbytes_per_s"), fmt(m.get("read_gbytes_per_s", "")),
                     fmt(m["fraction_of_measured_bandwidth"], 2),
                     "yes" if m.get("fits_in_llc") else "no"])
    if rows:
        bw = data["machine"].get("read_bandwidth", {})
        print("### decode_bandwidth\n")
        if bw:
            print(f'Streaming read, same run, over {bw["buffer_mib"]:.0f} MiB with {bw["threads"]} threads'
                  + (f' (over {bw["in_cache_buffer_mib"]:.0f} MiB: {fmt(bw["in_cache_gbytes_per_s"])} GB/s)'
                     if "in_cache_gbytes_per_s" in bw else "") + ", probed before each group: "
                  + "; ".join(f'{p["before"]} {fmt(p["gbytes_per_s"])} [{fmt(p["gbytes_per_s_min"])}, '
                              f'{fmt(p["gbytes_per_s_max"])}] GB/s' for p in bw.get("probes", [])) + ".\n")
        print(table(["layout", "element", "batch", "context", "ms/call", "GB/s", "read GB/s (probe)",
                     "fraction_of_measured_bandwidth", "K/V fit LLC"], rows))

    rows = []
    for r in of("layout_overhead"):
        p, m = r["params"], r["metrics"]
        layout = p["layout"] + (f' (page {p["page_size"]})' if "page_size" in p else "")
        rows.append([layout, p["element"], str(p["batch"]), str(p["context"]),
                     fmt(m["ratio_to_contiguous"]) + f' [{fmt(m["ratio_min"])}, {fmt(m["ratio_max"])}]',
                     spread(m, "layout_ms"), spread(m, "contiguous_ms"), str(p["rounds"])])
    if rows:
        print("### layout_overhead\n")
        print(table(["layout", "element", "batch", "context", "ratio_to_contiguous [paired min, max]",
                     "layout ms", "contiguous ms", "rounds"], rows))

    rows = []
    per_type = []
    for r in of("memory_waste"):
        p, m = r["params"], r["metrics"]
        if "element" in p:  # one full page per storage type: its bytes per token per layer
            per_type.append([p["element"], p["heads"], f'{m["bytes_per_token_per_layer"]:.0f}'])
            continue
        rows.append([p["workload"], p["layout"], str(p["requests"]), str(p["max_length"]),
                     f'{p["length_mean"]:.0f} / {p["length_median"]} / {p["length_max"]}',
                     f'{m["reserved_bytes"] / 2**20:.1f}', f'{m["live_bytes"] / 2**20:.1f}',
                     f'{100 * m["waste_fraction"]:.2f}%'])
    if rows:
        print("### memory_waste\n")
        print(table(["workload", "layout", "requests", "max length", "length mean / median / max",
                     "reserved MiB", "live MiB", "waste_fraction"], rows))
    if per_type:
        print("### memory_waste: bytes per token per layer by storage type\n")
        print(table(["element", "heads", "bytes per token per layer (K and V)"], per_type))

    rows, by_type = [], []
    for r in of("prefill"):
        p, m = r["params"], r["metrics"]
        if p.get("types_compared"):
            layout = p["layout"] + (f' (window {p["window"]}, {p["sinks"]} sinks)' if "window" in p else "")
            by_type.append([layout, p["element"], str(p["prefix"]), str(p["chunk"]), spread(m, "ms_per_chunk"),
                            spread(m, "gflop_per_s"),
                            f'{m["speed_vs_fp16"]:.2f} ({m["speed_vs_fp16_min"]:.2f} .. {m["speed_vs_fp16_max"]:.2f})'])
            continue
        rows.append([p["element"], str(p["prefix"]), str(p["chunk"]), spread(m, "ms_per_chunk"),
                     spread(m, "tokens_per_s"), spread(m, "gflop_per_s")])
    if rows:
        print("### prefill\n")
        print(table(["element", "prefix", "chunk", "ms/chunk", "tokens_per_s", "gflop_per_s"], rows))
    if by_type:
        print("### prefill: every layout and storage type\n")
        print(table(["layout", "element", "prefix", "chunk", "ms/chunk", "gflop_per_s",
                     "speed vs fp16 (per-round min .. max)"], by_type))

    rows = []
    for r in of("dynamic_heads"):
        p, m = r["params"], r["metrics"]
        rows.append([p["operation"], p["element"], str(p.get("batch", "")), str(p.get("context", "")),
                     str(p.get("chunk", "")), spread(m, "compiled_ms"), spread(m, "dynamic_ms"),
                     f'{m["ratio_to_compiled"]:.3f} ({m["ratio_min"]:.3f} .. {m["ratio_max"]:.3f})'])
    if rows:
        print("### dynamic_heads\n")
        print(table(["operation", "element", "batch", "context", "chunk", "compiled ms", "dynamic ms",
                     "dynamic / compiled (per-round min .. max)"], rows))

    rows = []
    for r in of("host_tier"):
        p, m = r["params"], r["metrics"]
        rows.append([p["element"], str(p["context"]), str(p["bytes"]), spread(m, "swap_out_ms"), spread(m, "swap_in_ms"),
                     spread(m, "copy_ms"),
                     f'{m["swap_in_fraction_of_copy"]:.2f} ({m["fraction_min"]:.2f} .. {m["fraction_max"]:.2f})'])
    if rows:
        print("### host_tier\n")
        print(table(["element", "context", "bytes", "swap_out ms", "swap_in ms", "memcpy ms",
                     "swap_in / memcpy rate (per-round min .. max)"], rows))

    rows = []
    for r in of("prefix_tiers"):
        p, m = r["params"], r["metrics"]
        tier = p["tier"] + (f' ({p["read_threads"]} threads)' if p.get("read_threads", 0) > 0 else "")
        spill = spread(m, "spill_ms") if "spill_ms" in m else ""
        spill_rate = f'{m["spill_fraction_of_copy"]:.2f} ({m["spill_fraction_min"]:.2f} .. {m["spill_fraction_max"]:.2f})' \
            if "spill_ms" in m else ""
        rows.append([tier, p["element"], str(p["context"]), str(p["layers"]), str(p["bytes"]),
                     spread(m, "bring_back_ms"), spread(m, "copy_ms"),
                     f'{m["bring_back_fraction_of_copy"]:.2f} ({m["fraction_min"]:.2f} .. {m["fraction_max"]:.2f})',
                     spill, spill_rate])
    if rows:
        print("### prefix_tiers\n")
        print(table(["tier", "element", "context", "layers", "bytes", "match_prefix ms", "memcpy ms",
                     "bring-back / memcpy rate (per-round min .. max)", "spill ms", "spill / memcpy rate"], rows))

    rows = []
    for r in of("element_types"):
        p, m = r["params"], r["metrics"]
        rows.append([p["layout"], p["heads"], str(p["context"]), p["element"], spread(m, "ms_per_step"),
                     f'{m["bytes_read"] / 2**20:.1f}', f'{m["gbytes_per_s"]:.1f}',
                     f'{m["fraction_of_measured_bandwidth"]:.2f}',
                     f'{m["speed_vs_fp16"]:.2f} ({m["speed_vs_fp16_min"]:.2f} .. {m["speed_vs_fp16_max"]:.2f})',
                     "yes" if p["kv_fit_llc"] else "no"])
    if rows:
        print("### element_types\n")
        print(table(["layout", "heads", "context", "element", "ms/step", "MiB read", "GB/s", "fraction of read",
                     "speed vs fp16 (per-round min .. max)", "fits LLC"], rows))

    rows = []
    for r in of("decode_cold"):
        p, m = r["params"], r["metrics"]
        ratio = "" if p["layout"] != "paged" else \
            f'{m["ratio_to_contiguous"]:.3f} ({m["ratio_to_contiguous_min"]:.2f} .. {m["ratio_to_contiguous_max"]:.2f})'
        layout = p["layout"] + (f' ({p["page_size"]})' if p.get("page_size") else "")
        rows.append([p["element"], p["heads"], str(p["context"]), layout, spread(m, "ms_per_step"),
                     f'{m["fraction_of_measured_bandwidth"]:.2f}', ratio,
                     f'{m["copies"]} ({m["working_set_mib"]:.0f} MiB{"" if m["working_set_over_llc"] else ", under 2x LLC"})'])
    if rows:
        print("### decode_cold\n")
        print(table(["element", "heads", "context", "layout (page size)", "ms/step", "fraction of read",
                     "paged / contiguous (per-step min .. max)", "copies per layout (working set)"], rows))


if __name__ == "__main__":
    main()
