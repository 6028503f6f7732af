// CPU decode and prefill attention over any layout view in host memory:
// threads across (sequence, KV head[, key split | query block]), each work
// item streaming its KV head once for all the query rows that use it: decode
// on the tiled kernel of tile_attention.hpp, prefill on the tiled matrix
// products of prefill_tiles.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "kvcache/backend/cpu/isa.hpp"
#include "kvcache/backend/cpu/merge_states.hpp"
#include "kvcache/backend/cpu/prefill_tiles.hpp"
#include "kvcache/backend/cpu/score_record.hpp"
#include "kvcache/backend/cpu/thread_pool.hpp"
#include "kvcache/backend/cpu/tile_attention.hpp"
#include "kvcache/core/element.hpp"
#include "kvcache/kernels/attention_options.hpp"
#include "kvcache/layout/paged_view.hpp"

namespace kvcache {
namespace cpu {
namespace detail {
inline namespace KVCACHE_CPU_ISA_NAMESPACE {

/// Fewest keys a decode split is given: below this, splitting costs more in
/// merging than it gains in threads.
inline constexpr int min_split_keys = 256;

/// True for the layouts whose pages hold every KV head's rows of a few
/// tokens side by side: decode walks such a page's heads together, so a page
/// is read as one stream instead of one 4 KiB block per head each starting a
/// stream of its own (the hardware prefetchers do not follow a head from one
/// page to the next).
/// @tparam Layout a layout view
template <class Layout>
inline constexpr bool pages_interleave_heads_v = false;
template <class Element, class Heads, page_order Order>
inline constexpr bool pages_interleave_heads_v<paged_view<Element, Heads, Order>> = true;

/// Keys each KV head folds before the next head of its work item takes its
/// turn, when heads are walked together: two tiles (four 16-token pages).
/// Measured against 32, 128 and 256 in docs/performance.md; 32 pays a walk's
/// fixed costs every tile, 256 leaves a head's pages too far apart again.
inline constexpr int heads_together_keys = 2 * tile_keys;

/// KV heads per work item when decode walks heads together: the largest
/// divisor of kv_heads that leaves batch x (kv_heads / heads) items either a
/// multiple of the threads or at least four per thread, so the threads finish
/// together (all of a sequence's heads in one item when the batch is a
/// multiple of the threads; one head per item when nothing coarser balances).
inline int heads_per_decode_item(int batch, int kv_heads, int threads) noexcept {
    for (int heads = kv_heads; heads > 1; --heads) {
        if (kv_heads % heads != 0) continue;
        const int items = batch * (kv_heads / heads);
        if (items >= threads && (items % threads == 0 || items >= 4 * threads)) return heads;
    }
    return 1;
}

/// Decode of the KV heads [first_head, last_head) of one sequence over their
/// visible keys [begin, end): each head's group query rows, all at the
/// sequence's last position; writes the normalised rows and, when lse is not
/// null, their log-sum-exps. queries/outputs/lse: from the first head's first
/// row. Several heads walk the keys in blocks of heads_together_keys, head
/// after head within a block, each walk asking for the next one's first tile;
/// one head walks them at once. record (nullable; one head only, listing rows
/// 0..group-1) keeps the weights, with the lse of [begin, end) set.
template <class Layout, class Query, class Output>
void decode_heads(const Layout& view, int sequence, int first_head, int last_head, int begin, int end,
                  const Query* queries, float scale, float soft_cap, Output* outputs, float* lse,
                  score_record* record = nullptr) {
    using heads = typename Layout::heads;
    constexpr int dim = heads::head_dim;
    const int group = view.group_size();
    const int count = last_head - first_head;
    std::vector<tile_attention<dim>> states;
    states.reserve(std::size_t(count));
    const int position = view.length(sequence) - 1;
    for (int h = 0; h < count; ++h) {
        states.emplace_back(group);
        for (int g = 0; g < group; ++g) states.back().load(g, queries + (h * group + g) * dim, scale, position);
    }
    const int block = count > 1 ? heads_together_keys : std::max(end - begin, 1);
    for (int from = begin; from < end; from += block) {
        const int to = std::min(end, from + block);
        for (int h = 0; h < count; ++h) {
            walk_links links;  // each walk asks for the next one's first tile
            links.first_tile_asked = h > 0 || from > begin;
            if (h + 1 < count) {
                links.next_kv_head = first_head + h + 1;
                links.next_begin = from;
                links.next_end = to;
            } else if (to < end) {
                links.next_kv_head = first_head;
                links.next_begin = to;
                links.next_end = std::min(end, to + block);
            }
            states[std::size_t(h)].attend(view, sequence, first_head + h, from, to, soft_cap, record, links);
        }
    }
    for (int h = 0; h < count; ++h)
        for (int g = 0; g < group; ++g)
            states[std::size_t(h)].store(g, outputs + (h * group + g) * dim, lse ? lse + h * group + g : nullptr,
                                         scales_of(view).value);
    if (record)
        for (int g = 0; g < group; ++g) record->set_lse(std::size_t(g), states.front().lse(g));
}

/// The rows 0..n-1 of a work item, as a score_record lists them.
inline std::vector<int> first_rows(int n) {
    std::vector<int> rows(std::size_t(std::max(n, 0)));
    for (int r = 0; r < n; ++r) rows[std::size_t(r)] = r;
    return rows;
}

/// Decode attention on pool's threads: one query per sequence at position
/// length - 1. queries/outputs: [batch][query_heads][head_dim]; lse
/// (nullable): [batch][query_heads]; scores (nullable): [batch][kv_heads][score_stride]
/// (see decode_params). Arguments are checked by the caller.
/// @tparam Layout a layout view over host memory
/// @tparam Query float, kvcache::half or kvcache::bfloat16
template <class Layout, class Query>
void decode(thread_pool& pool, const Layout& view, const Query* queries, Query* outputs, float* lse,
            const attention_options& options, float* scores = nullptr, int score_stride = 0) {
    using heads = typename Layout::heads;
    constexpr int dim = heads::head_dim;
    const int group = view.group_size();
    const int batch = view.sequence_count();
    if (batch == 0) return;
    // An fp8 cache's scales leave the kernels: a key scale multiplies every
    // logit (so the softmax scale), a value scale every output row.
    const float scale = resolved_softmax_scale(options, dim) * scales_of(view).key;
    const int items = batch * view.kv_heads();
    int splits = options.kv_splits;
    if (splits <= 0) splits = items >= pool.threads() ? 1 : (pool.threads() + items - 1) / items;
    auto visible_keys = [&](int b) { return view.length(b) > 0 ? view.visible_count(b) : 0; };
    auto score_block = [&](int item) { return scores + std::size_t(item) * score_stride; };  // item = b * kv_heads + kv
    if constexpr (pages_interleave_heads_v<Layout>) {
        if (splits == 1 && !scores) {
            const int heads_per_item = heads_per_decode_item(batch, view.kv_heads(), pool.threads());
            const int chunks = view.kv_heads() / heads_per_item;  // a divisor
            pool.parallel_for(batch * chunks, [&](int item) {
                const int b = item / chunks, first = item % chunks * heads_per_item;
                const std::size_t first_row = std::size_t(b) * view.query_heads() + std::size_t(first) * group;
                decode_heads(view, b, first, first + heads_per_item, 0, visible_keys(b), queries + first_row * dim,
                             scale, options.logits_soft_cap, outputs + first_row * dim,
                             lse ? lse + first_row : nullptr);
            });
            return;
        }
    }
    if (splits == 1) {
        pool.parallel_for(items, [&](int item) {
            const int b = item / view.kv_heads(), kv = item % view.kv_heads();
            const std::size_t first_row = std::size_t(b) * view.query_heads() + std::size_t(kv) * group;
            if (!scores) {
                decode_heads(view, b, kv, kv + 1, 0, visible_keys(b), queries + first_row * dim, scale,
                             options.logits_soft_cap, outputs + first_row * dim, lse ? lse + first_row : nullptr);
                return;
            }
            score_record record(first_rows(group));
            decode_heads(view, b, kv, kv + 1, 0, visible_keys(b), queries + first_row * dim, scale,
                         options.logits_soft_cap, outputs + first_row * dim, lse ? lse + first_row : nullptr, &record);
            std::fill(score_block(item), score_block(item) + score_stride, 0.0f);
            record.add_to(score_block(item));
        });
        return;
    }
    // Split-KV: partial states [split][row], then the one merge over the splits.
    const std::size_t rows = std::size_t(batch) * view.query_heads();
    std::vector<float> partial(rows * splits * dim), partial_lse(rows * splits);
    std::vector<score_record> records;
    if (scores) records.assign(std::size_t(items) * splits, score_record(first_rows(group)));
    pool.parallel_for(items * splits, [&](int work) {
        const int item = work / splits, split = work % splits;
        const int b = item / view.kv_heads(), kv = item % view.kv_heads();
        const std::size_t first_row = std::size_t(b) * view.query_heads() + std::size_t(kv) * group;
        const int visible = visible_keys(b);
        const int chunk = std::max((visible + splits - 1) / splits, min_split_keys);
        const int begin = std::min(visible, split * chunk), end = std::min(visible, begin + chunk);
        const std::size_t slot = std::size_t(split) * rows + first_row;
        decode_heads(view, b, kv, kv + 1, begin, end, queries + first_row * dim, scale, options.logits_soft_cap,
                     partial.data() + slot * dim, partial_lse.data() + slot, scores ? &records[work] : nullptr);
    });
    if (!scores) {
        merge_rows(splits, int(rows), dim, partial.data(), partial_lse.data(), outputs, lse);
        return;
    }
    // A split's weights are normalised over its own keys; over all of them
    // they need the merged lse, which the merge writes here when the caller's is null.
    std::vector<float> own_lse(lse ? 0 : rows);
    float* merged_lse = lse ? lse : own_lse.data();
    merge_rows(splits, int(rows), dim, partial.data(), partial_lse.data(), outputs, merged_lse);
    pool.parallel_for(items, [&](int item) {
        const std::size_t first_row = std::size_t(item / view.kv_heads()) * view.query_heads() +
                                      std::size_t(item % view.kv_heads()) * group;
        std::fill(score_block(item), score_block(item) + score_stride, 0.0f);
        for (int split = 0; split < splits; ++split) {
            score_record& record = records[std::size_t(item) * splits + split];
            for (int g = 0; g < group; ++g) record.set_lse(std::size_t(g), merged_lse[first_row + g]);
            record.add_to(score_block(item));
        }
    });
}

/// Query tokens of one prefill work item (times the GQA group: its rows)
/// for a group of `group` query heads: as many as fill the product
/// kernels' rows (prefill_block_rows), at least one.
inline int prefill_block_tokens(int group) noexcept { return std::max(1, prefill_block_rows / group); }

/// Prefill attention on pool's threads: query token t of sequence b is at position
/// query_positions[query_offsets[b] + t] when query_positions is not null
/// (any value >= 0, in any order), else at length_b - n_b + t (the last n_b
/// positions, already appended); it sees each present key at a position p <= its own
/// that view.visibility() allows. queries/outputs:
/// [query tokens][query_heads][head_dim]; lse (nullable): [query tokens][query_heads];
/// scores (nullable): [batch][kv_heads][score_stride], from each sequence's
/// last score_queries tokens (0: all; see prefill_params). Arguments are
/// checked by the caller.
/// @tparam Layout a layout view over host memory
/// @tparam Query float, kvcache::half or kvcache::bfloat16
template <class Layout, class Query>
void prefill(thread_pool& pool, const Layout& view, const Query* queries, const int* query_offsets,
             const int* query_positions, Query* outputs, float* lse, const attention_options& options,
             float* scores = nullptr, int score_stride = 0, int score_queries = 0) {
    using heads = typename Layout::heads;
    constexpr int dim = heads::head_dim;
    const int group = view.group_size();
    const int batch = view.sequence_count();
    if (batch == 0) return;
    const float scale = resolved_softmax_scale(options, dim) * scales_of(view).key;  // as in decode
    auto position_of = [&](int b, int t) {  // t counts from the sequence's first query token
        const int tokens = query_offsets[b + 1] - query_offsets[b];
        return query_positions ? query_positions[query_offsets[b] + t] : view.length(b) - tokens + t;
    };
    struct work_item { int sequence, kv_head, first_token, tokens, keys; };
    std::vector<work_item> work;
    const int block_tokens = prefill_block_tokens(group);
    for (int b = 0; b < batch; ++b) {
        const int tokens = query_offsets[b + 1] - query_offsets[b];
        for (int t = 0; t < tokens; t += block_tokens) {
            const int n = std::min(block_tokens, tokens - t);
            int last = 0;
            for (int i = t; i < t + n; ++i) last = std::max(last, position_of(b, i));
            const int keys = last < view.length(b) ? last + 1 : view.length(b);  // most keys the block may see
            for (int kv = 0; kv < view.kv_heads(); ++kv) work.push_back({b, kv, t, n, keys});
        }
    }
    // Longest items first, so the threads finish together (causal blocks grow along the chunk).
    std::stable_sort(work.begin(), work.end(), [](const work_item& a, const work_item& b) { return a.keys > b.keys; });
    // Scores: each item keeps the weights of its contributing rows; blocks of
    // one (sequence, KV head) add them into the same entries afterwards.
    std::vector<std::unique_ptr<score_record>> records(scores ? work.size() : 0);
    pool.parallel_for(int(work.size()), [&](int index) {
        const work_item item = work[index];
        const int b = item.sequence;
        prefill_block<dim> rows(item.tokens * group);
        auto row_of = [&](int t, int g) {
            return std::size_t(query_offsets[b] + item.first_token + t) * view.query_heads() +
                   std::size_t(item.kv_head) * group + g;
        };
        for (int t = 0; t < item.tokens; ++t) {
            const int position = position_of(b, item.first_token + t);
            for (int g = 0; g < group; ++g) rows.load(t * group + g, queries + row_of(t, g) * dim, scale, position);
        }
        const int visible = view.length(b) > 0 ? view.visible_count(b) : 0;
        score_record* record = nullptr;
        if (scores) {
            const int tokens = query_offsets[b + 1] - query_offsets[b];
            const int first_scored = score_queries > 0 ? std::max(0, tokens - score_queries) : 0;
            const int skip = std::min(item.tokens, std::max(0, first_scored - item.first_token));
            if (skip < item.tokens) {
                std::vector<int> scored = first_rows((item.tokens - skip) * group);
                for (int& r : scored) r += skip * group;
                records[index] = std::make_unique<score_record>(std::move(scored));
                record = records[index].get();
            }
        }
        rows.attend(view, b, item.kv_head, 0, visible, options.logits_soft_cap, record);
        for (int t = 0; t < item.tokens; ++t)
            for (int g = 0; g < group; ++g)
                rows.store(t * group + g, outputs + row_of(t, g) * dim, lse ? lse + row_of(t, g) : nullptr,
                           scales_of(view).value);
        if (record)
            for (std::size_t j = 0; j < record->rows().size(); ++j) record->set_lse(j, rows.lse(record->rows()[j]));
    });
    if (!scores) return;
    const int pairs = batch * view.kv_heads();
    std::vector<std::vector<const score_record*>> by_pair{std::size_t(pairs)};
    for (std::size_t i = 0; i < work.size(); ++i)
        if (records[i]) by_pair[std::size_t(work[i].sequence) * view.kv_heads() + work[i].kv_head].push_back(records[i].get());
    pool.parallel_for(pairs, [&](int pair) {
        float* block = scores + std::size_t(pair) * score_stride;
        std::fill(block, block + score_stride, 0.0f);
        for (const score_record* record : by_pair[std::size_t(pair)]) record->add_to(block);
    });
}

}  // namespace KVCACHE_CPU_ISA_NAMESPACE
}  // namespace detail
}  // namespace cpu
}  // namespace kvcache
