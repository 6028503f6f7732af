#!/usr/bin/env python3
"""kvcache's CUDA figures beside what users would pick instead, on the same shapes.

Reads the JSON of `kvcache_bench --backend cuda` (its cuda_decode and
cuda_prefill rows are the shapes list), runs PyTorch's
scaled_dot_product_attention on contiguous K/V and FlashInfer's batch decode
and prefill over a paged cache (16-token pages) on those shapes, compares the
peers' outputs with each other before any time counts, and writes a JSON with
one row per kvcache row: the peers' times and speed_vs_<peer> = peer ms /
kvcache ms (above 1: kvcache is faster).

Random data: every peer sees the same seeded tensors (torch.Generator,
uniform [-1, 1), the distribution kvcache_bench draws from with its own
generator). Times are CUDA events over many calls after warm-up, rotating over
enough K/V sets to exceed four L2s, as the C++ bench does.

FlashInfer JIT-compiles a kernel per (head_dim, group size, dtype, kind) the
first time it runs, which takes tens of seconds each: --flashinfer-configs
(default 3) limits it to the first configurations of the list (GQA 32/8/128
decode, MQA or MHA decode, GQA prefill), and the JSON records how long the
compiles took. Other rows carry a note instead of a FlashInfer time.

--dry-run needs neither torch nor flashinfer nor a GPU: it checks the shapes,
makes fake peer timings from each row's bytes, merges them with kvcache's
rows and checks the ratio table (the CTest bench_peers_dry_run).
"""
import argparse
import json
import sys
import time

PAGE_SIZE = 16
TOLERANCE = 2e-2  # fp16 outputs of two kernels over the same inputs


def shapes_from(kvcache_json):
    """The decode and prefill shapes of kvcache's CUDA rows (fp16 only: the peers' type)."""
    decode, prefill = [], []
    for i, row in enumerate(kvcache_json.get("results", [])):
        name = row.get("benchmark")
        params = row.get("params")
        metrics = row.get("metrics")
        if name not in ("cuda_decode", "cuda_prefill"):
            continue
        if not isinstance(params, dict) or not isinstance(metrics, dict):
            raise ValueError(f"result {i} ({name}) has no params or metrics object")
        if params.get("element") != "fp16":
            continue
        heads = str(params.get("heads", ""))
        try:
            q, rest = heads.split("q/")
            kv, d = rest.split("kv/d")
            q, kv, d = int(q), int(kv), int(d)
        except ValueError:
            raise ValueError(f"result {i} ({name}): heads '{heads}' is not <q>q/<kv>kv/d<dim>")
        if q % kv:
            raise ValueError(f"result {i} ({name}): {q} query heads are not a multiple of {kv} KV heads")
        if name == "cuda_decode":
            for key in ("batch", "context", "layout"):
                if key not in params:
                    raise ValueError(f"result {i} (cuda_decode) has no param '{key}'")
            if "ms_per_call" not in metrics:
                raise ValueError(f"result {i} (cuda_decode) has no metric 'ms_per_call'")
            decode.append({"row": i, "kind": "decode", "batch": int(params["batch"]), "context": int(params["context"]),
                           "layout": params["layout"], "q": q, "kv": kv, "d": d, "kvcache_ms": metrics["ms_per_call"]})
        else:
            for key in ("chunk", "prefix"):
                if key not in params:
                    raise ValueError(f"result {i} (cuda_prefill) has no param '{key}'")
            if "ms_per_chunk" not in metrics:
                raise ValueError(f"result {i} (cuda_prefill) has no metric 'ms_per_chunk'")
            prefill.append({"row": i, "kind": "prefill", "batch": int(params.get("batch", 1)),
                            "chunk": int(params["chunk"]), "prefix": int(params["prefix"]), "layout": "paged",
                            "q": q, "kv": kv, "d": d, "kvcache_ms": metrics["ms_per_chunk"]})
    if not decode and not prefill:
        raise ValueError("the kvcache JSON has no fp16 cuda_decode or cuda_prefill rows (run kvcache_bench --backend cuda)")
    return decode, prefill


def kv_bytes(shape):
    tokens = shape["context"] if shape["kind"] == "decode" else shape["prefix"] + shape["chunk"]
    return shape["batch"] * tokens * 2 * shape["kv"] * shape["d"] * 2


def flashinfer_key(shape):
    """What FlashInfer compiles a kernel for."""
    return (shape["kind"], shape["d"], shape["q"] // shape["kv"])


def choose_flashinfer(shapes, limit):
    """The first `limit` kernel configurations: the targets' GQA d128 decode and prefill, then MQA d128
    decode, then the rest in list order."""
    priority = [("decode", 128, 4), ("prefill", 128, 4), ("decode", 128, 32)]
    order = sorted(shapes, key=lambda s: priority.index(flashinfer_key(s)) if flashinfer_key(s) in priority else 9)
    keys = []
    for s in order:
        k = flashinfer_key(s)
        if k not in keys and len(keys) < limit:
            keys.append(k)
    return keys


def merge(shapes, peer_ms, notes):
    """One row per shape: kvcache's time, each peer's, and speed_vs_<peer>."""
    rows = []
    for s in shapes:
        row = {k: s[k] for k in s}
        for peer, times in peer_ms.items():
            ms = times.get(s["row"])
            if ms is None:
                row[f"{peer}_note"] = notes.get((peer, s["row"]), "not run")
                continue
            if not (ms > 0 and s["kvcache_ms"] > 0):
                raise ValueError(f"row {s['row']}: non-positive time ({peer} {ms}, kvcache {s['kvcache_ms']})")
            row[f"{peer}_ms"] = ms
            row[f"speed_vs_{peer}"] = ms / s["kvcache_ms"]
        rows.append(row)
    return rows


def describe(s):
    if s["kind"] == "decode":
        return f"decode {s['layout']} b{s['batch']} ctx{s['context']} {s['q']}/{s['kv']}/d{s['d']}"
    return f"prefill chunk{s['chunk']}+{s['prefix']} {s['q']}/{s['kv']}/d{s['d']}"


def print_table(rows, peers):
    header = f"{'shape':<44} {'kvcache ms':>11}" + "".join(f" {p + ' ms':>15} {'x vs ' + p:>14}" for p in peers)
    print(header)
    for r in rows:
        line = f"{describe(r):<44} {r['kvcache_ms']:>11.4f}"
        for p in peers:
            if f"{p}_ms" in r:
                line += f" {r[p + '_ms']:>15.4f} {r['speed_vs_' + p]:>14.3f}"
            else:
                line += f" {'-':>15} {'-':>14}"
        print(line)
    print("x vs peer = peer ms / kvcache ms (above 1: kvcache is faster)")


def dry_run(shapes, flashinfer_limit):
    """Fake peer times from bytes (3 TB/s torch, 4 TB/s FlashInfer), then the same merge and table."""
    chosen = choose_flashinfer(shapes, flashinfer_limit)
    torch_ms, fi_ms, notes = {}, {}, {}
    for s in shapes:
        torch_ms[s["row"]] = kv_bytes(s) / 3e12 * 1e3
        if flashinfer_key(s) in chosen:
            fi_ms[s["row"]] = kv_bytes(s) / 4e12 * 1e3
        else:
            notes[("flashinfer", s["row"])] = "not compiled (--flashinfer-configs)"
    rows = merge(shapes, {"torch_sdpa": torch_ms, "flashinfer": fi_ms}, notes)
    # The merge must divide the right numbers: recompute each ratio from the inputs.
    for r, s in zip(rows, shapes):
        want = torch_ms[s["row"]] / s["kvcache_ms"]
        if abs(r["speed_vs_torch_sdpa"] - want) > 1e-12 * max(1.0, want):
            raise AssertionError(f"row {s['row']}: speed_vs_torch_sdpa {r['speed_vs_torch_sdpa']} != {want}")
        if ("flashinfer_ms" in r) != (flashinfer_key(s) in chosen):
            raise AssertionError(f"row {s['row']}: FlashInfer ran outside its {flashinfer_limit} configurations")
    return rows, {"flashinfer_configurations": [list(k) for k in chosen], "dry_run": True}


def run_peers(shapes, flashinfer_limit, seed, min_l2_multiple=4):
    import torch  # the device image's PyTorch
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    gen = torch.Generator(device=device).manual_seed(seed)

    def uniform(*size):
        return (torch.rand(*size, generator=gen, device=device, dtype=torch.float32) * 2 - 1).half()

    def timed(call, sets, warmup=3, repeats=7):
        calls = max(sets, 20)
        for i in range(max(warmup, sets)):
            call(i % sets)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(repeats):
            start.record()
            for i in range(calls):
                call(i % sets)
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) / calls)
        samples.sort()
        return samples[len(samples) // 2]

    try:
        import flashinfer
        flashinfer_missing = None
    except ImportError as e:
        flashinfer = None
        flashinfer_missing = f"flashinfer not importable ({e})"
    chosen = choose_flashinfer(shapes, flashinfer_limit) if flashinfer else []
    compile_seconds = {}
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=device)

    def paged(rows, pages):
        """[batch, kv, tokens, d] rows as [batch * pages, page, kv, d] (NHD), sequence b's pages consecutive."""
        b, kv, tokens, d = rows.shape
        padded = torch.zeros(b, kv, pages * PAGE_SIZE, d, dtype=torch.half, device=device)
        padded[:, :, :tokens] = rows
        return padded.view(b, kv, pages, PAGE_SIZE, d).permute(0, 2, 3, 1, 4).reshape(b * pages, PAGE_SIZE, kv, d)

    def flashinfer_ms(s, qs, ks, vs, reference, sets):
        """FlashInfer's time on the same data, or a note why not (its outputs checked against torch's first)."""
        b, q, kv, d = s["batch"], s["q"], s["kv"], s["d"]
        tokens = ks[0].shape[2]
        queries = qs.shape[2]
        pages = -(-tokens // PAGE_SIZE)
        caches = [torch.stack([paged(ks[i], pages), paged(vs[i], pages)], dim=1).contiguous() for i in range(sets)]
        indptr = torch.arange(0, (b + 1) * pages, pages, dtype=torch.int32, device=device)
        indices = torch.arange(b * pages, dtype=torch.int32, device=device)
        last = torch.full((b,), tokens - (pages - 1) * PAGE_SIZE, dtype=torch.int32, device=device)
        began = time.time()
        if s["kind"] == "decode":
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
            wrapper.plan(indptr, indices, last, q, kv, d, PAGE_SIZE, q_data_type=torch.half, kv_data_type=torch.half)
            fq = qs[:, :, 0, :].contiguous()  # [batch, heads, dim]
            ref = reference[:, :, 0, :]
        else:
            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
            qo_indptr = torch.arange(0, (b + 1) * queries, queries, dtype=torch.int32, device=device)
            wrapper.plan(qo_indptr, indptr, indices, last, q, kv, d, PAGE_SIZE, causal=True,
                         q_data_type=torch.half, kv_data_type=torch.half)
            fq = qs.permute(0, 2, 1, 3).reshape(b * queries, q, d).contiguous()  # [tokens, heads, dim]
            ref = reference.permute(0, 2, 1, 3).reshape(b * queries, q, d)

        def fi(i):
            return wrapper.run(fq, caches[i])

        out = fi(0)
        torch.cuda.synchronize()
        compile_seconds.setdefault(str(flashinfer_key(s)), time.time() - began)
        err = (out.float() - ref.float()).abs().max().item()
        if err > TOLERANCE:
            return None, f"outputs differ from torch by {err:.3g}: not timed"
        return timed(fi, sets), None

    torch_ms, fi_ms, notes, mismatches = {}, {}, {}, []
    for s in shapes:
        b, q, kv, d = s["batch"], s["q"], s["kv"], s["d"]
        tokens = s["context"] if s["kind"] == "decode" else s["prefix"] + s["chunk"]
        queries = 1 if s["kind"] == "decode" else s["chunk"]
        sets = max(1, min(512, -(-min_l2_multiple * l2 // kv_bytes(s)))) if s["kind"] == "decode" else 1
        if 3 * sets * kv_bytes(s) > torch.cuda.mem_get_info()[0]:
            for peer in ("torch_sdpa", "flashinfer"):
                notes[(peer, s["row"])] = "skipped: not enough device memory"
            continue
        # Contiguous [batch, kv heads, tokens, dim] per set; FlashInfer's paged cache holds the same rows.
        ks = [uniform(b, kv, tokens, d) for _ in range(sets)]
        vs = [uniform(b, kv, tokens, d) for _ in range(sets)]
        qs = uniform(b, q, queries, d)
        mask = None
        if s["kind"] == "prefill":  # causal, bottom-right: query i sees the prefix and chunk tokens up to i
            rows_pos = torch.arange(queries, device=device)[:, None] + s["prefix"]
            mask = torch.arange(tokens, device=device)[None, :] <= rows_pos

        def sdpa(i):
            try:
                return torch.nn.functional.scaled_dot_product_attention(qs, ks[i], vs[i], attn_mask=mask,
                                                                        enable_gqa=True)
            except TypeError:  # torch before 2.5: no enable_gqa, so the KV heads are repeated per group
                group = q // kv
                return torch.nn.functional.scaled_dot_product_attention(
                    qs, ks[i].repeat_interleave(group, dim=1), vs[i].repeat_interleave(group, dim=1), attn_mask=mask)

        reference = sdpa(0)
        torch_ms[s["row"]] = timed(sdpa, sets)
        if flashinfer is None:
            notes[("flashinfer", s["row"])] = flashinfer_missing
        elif flashinfer_key(s) not in chosen:
            notes[("flashinfer", s["row"])] = "not compiled (--flashinfer-configs)"
        else:
            try:
                ms, why = flashinfer_ms(s, qs, ks, vs, reference, sets)
            except Exception as e:  # an unsupported group size or a JIT failure: noted, not fatal
                ms, why = None, f"FlashInfer failed: {type(e).__name__}: {e}"[:200]
            if ms is not None:
                fi_ms[s["row"]] = ms
            else:
                notes[("flashinfer", s["row"])] = why
                if why.startswith("outputs differ"):
                    mismatches.append(f"{describe(s)}: FlashInfer {why}")
        del ks, vs, qs, reference
        torch.cuda.empty_cache()
    rows = merge(shapes, {"torch_sdpa": torch_ms, "flashinfer": fi_ms}, notes)
    extra = {"flashinfer_configurations": [list(k) for k in chosen], "flashinfer_first_call_seconds": compile_seconds,
             "mismatches": mismatches, "torch": torch.__version__, "device": torch.cuda.get_device_name(device)}
    if flashinfer is not None:
        extra["flashinfer"] = getattr(flashinfer, "__version__", "unknown")
    return rows, extra


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvcache-json", required=True, help="kvcache_bench --backend cuda --json output")
    parser.add_argument("--out", help="where to write the merged JSON")
    parser.add_argument("--dry-run", action="store_true", help="fake peer timings; needs no torch, flashinfer or GPU")
    parser.add_argument("--flashinfer-configs", type=int, default=3, help="FlashInfer kernel configurations to compile")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    with open(args.kvcache_json) as f:
        kvcache_json = json.load(f)
    decode, prefill = shapes_from(kvcache_json)
    shapes = decode + prefill
    print(f"peers: {len(decode)} decode and {len(prefill)} prefill shapes from {args.kvcache_json}")
    if args.dry_run:
        rows, extra = dry_run(shapes, args.flashinfer_configs)
    else:
        rows, extra = run_peers(shapes, args.flashinfer_configs, args.seed)
    peers = ["torch_sdpa", "flashinfer"]
    print_table(rows, peers)
    merged = {"machine": kvcache_json.get("machine", {}), "peers": extra, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(merged, f, indent=2)
        print(f"peers: wrote {args.out}")
    if extra.get("mismatches"):
        print("peers: outputs differ:\n  " + "\n  ".join(extra["mismatches"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, AssertionError, OSError) as e:
        print(f"peers: {e}", file=sys.stderr)
        sys.exit(1)
