// A sequence's pages out of one paged cache and into another: round trips
// through bytes, pages shared from the receiver's prefix cache instead of
// copied, exports that leave the shared pages out, compacted and
// sliding-window sequences (only the rows they hold, at their positions), and
// every refusal with the receiver unchanged.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cache_test_support.hpp"
#include "kvcache/kvcache.hpp"

namespace {

using namespace kvcache;
using heads = head_config<8, 2, 32>;
constexpr int row = 2 * 32;  // kv_heads x head_dim
constexpr int page = 8, layers = 2;

/// Token ids 1000 + i (prompt) or another run from `salt`.
std::vector<std::int32_t> prompt_tokens(int n, int salt = 0) {
    std::vector<std::int32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = 1000 + i + salt * 7919;
    return t;
}

/// Rows of token position p, layer l, for a key (0) or value (1), from the
/// token id: equal tokens at equal positions get equal rows, as a model gives.
float row_value(std::int32_t token, int position, int layer, int kv, int i) {
    return float((token * 31 + position * 7 + layer * 13 + kv * 5 + i) % 97) / 97.0f - 0.5f;
}

/// A sequence holding `tokens`, appended in one step with its token ids.
template <class Element>
sequence_id add_prompt(paged_cache<Element, heads>& cache, const std::vector<std::int32_t>& tokens, int first = 0) {
    const sequence_id id = cache.add_sequence();
    const int n = int(tokens.size()) - first;
    const int at = cache.begin_append(id, n, std::vector<std::int32_t>(tokens.begin() + first, tokens.end()));
    for (int l = 0; l < layers; ++l) {
        std::vector<float> k(std::size_t(n) * row), v(k.size());
        for (int t = 0; t < n; ++t)
            for (int i = 0; i < row; ++i) {
                k[std::size_t(t) * row + i] = row_value(tokens[first + t], at + t, l, 0, i);
                v[std::size_t(t) * row + i] = row_value(tokens[first + t], at + t, l, 1, i);
            }
        cache.write(id, l, at, span<const float>(k), span<const float>(v), n);
    }
    cache.publish(id);
    return id;
}

template <class Element>
std::vector<Element> rows_of(const paged_cache<Element, heads>& cache, sequence_id id, int layer) {
    const int n = cache.length(id);
    std::vector<Element> k(std::size_t(n) * row), v(k.size());
    cache.read(id, layer, 0, n, span<Element>(k), span<Element>(v));
    k.insert(k.end(), v.begin(), v.end());
    return k;
}

template <class Element>
bool same_rows(const paged_cache<Element, heads>& a, sequence_id ia, const paged_cache<Element, heads>& b,
               sequence_id ib) {
    if (a.length(ia) != b.length(ib)) return false;
    for (int l = 0; l < layers; ++l) {
        const auto x = rows_of(a, ia, l), y = rows_of(b, ib, l);
        for (std::size_t i = 0; i < x.size(); ++i)
            if (element_traits<Element>::to_float(x[i]) != element_traits<Element>::to_float(y[i])) return false;
    }
    return true;
}

/// Whether the reference's decode attention of one query over layer `layer`
/// of sequence ia in a equals that of ib in b (the same rows attend the same).
template <class CacheA, class CacheB>
bool same_attention(CacheA& a, sequence_id ia, CacheB& b, sequence_id ib, int layer) {
    const reference_backend reference;
    std::vector<float> q(8 * 32), out_a(q.size()), out_b(q.size());
    std::iota(q.begin(), q.end(), -100.0f);
    for (float& x : q) x /= 128.0f;
    reference.decode(decode_params(a.view(layer, {ia}), q, out_a));
    reference.decode(decode_params(b.view(layer, {ib}), q, out_b));
    return out_a == out_b;
}

/// What a refused import must leave as it was.
struct snapshot {
    std::vector<sequence_id> sequences;
    int used, free, cached;
    template <class Cache>
    explicit snapshot(const Cache& c)
        : sequences(c.sequences()), used(c.statistics().pages_used), free(c.statistics().pages_free),
          cached(c.statistics().pages_cached) {}
    bool operator==(const snapshot& o) const {
        return sequences == o.sequences && used == o.used && free == o.free && cached == o.cached;
    }
};

TEST_CASE("a sequence's pages go through bytes into another cache and attend there as they did") {
    paged_cache<half, heads> prefill(layers, 16, page), decode(layers, 16, page);
    const auto tokens = prompt_tokens(45);  // 5 full pages and 5 rows of a sixth
    const sequence_id source = add_prompt(prefill, tokens);
    const page_export<half> sent = export_pages(prefill, source);
    CHECK(sent.page_count() == 6);
    CHECK(sent.page_hashes.size() == 5);
    CHECK(sent.payload_bytes() == std::size_t(45) * row * 2 * layers * sizeof(half));
    const auto bytes = to_bytes(sent);
    const sequence_id id = import_pages(decode, page_export_from_bytes<half>(bytes));
    CHECK(same_rows(prefill, source, decode, id));
    CHECK(decode.token_ids(id) == tokens);
    CHECK(decode.pages(id).size() == 6);
    // The full pages entered the receiver's prefix index: another request with
    // the same prompt shares them.
    const sequence_id again = decode.add_sequence();
    CHECK(decode.match_prefix(again, std::vector<std::int32_t>(tokens.begin(), tokens.begin() + 44)) == 40);
    CHECK(decode.page_references(decode.pages(id)[0]) == 2);
    // Attention on the receiver equals attention on the sender (rows are equal).
    CHECK(same_attention(prefill, source, decode, id, 1));
}

TEST_CASE("pages the receiver already caches are shared, not copied, and may be left out of the export") {
    paged_cache<float, heads> prefill(layers, 16, page), decode(layers, 16, page);
    const auto system = prompt_tokens(24);  // 3 pages of a shared system prompt
    auto tokens = system;
    const auto user = prompt_tokens(13, 1);
    tokens.insert(tokens.end(), user.begin(), user.end());  // 37 tokens: 4 full pages and 5 rows
    const sequence_id source = add_prompt(prefill, tokens);
    const sequence_id earlier = add_prompt(decode, system);  // the receiver served the system prompt before
    const int used_before = decode.statistics().pages_used;

    SUBCASE("a whole export: the cached pages are taken from the receiver") {
        const sequence_id id = import_pages(decode, export_pages(prefill, source));
        CHECK(same_rows(prefill, source, decode, id));
        for (int p = 0; p < 3; ++p) CHECK(decode.pages(id)[p] == decode.pages(earlier)[p]);
        CHECK(decode.statistics().pages_used == used_before + 2);  // only pages 3 and 4 are new
    }
    SUBCASE("an export from page 3 on carries 13 rows and still rebuilds all 37") {
        const page_export<float> sent = export_pages(prefill, source, 3);
        CHECK(sent.payload.size() == std::size_t(13) * row * 2 * layers);
        const sequence_id id = import_pages(decode, sent);
        CHECK(same_rows(prefill, source, decode, id));
        CHECK(decode.statistics().pages_used == used_before + 2);
    }
    SUBCASE("an export leaving out a page the receiver lacks is refused, the receiver unchanged") {
        paged_cache<float, heads> fresh(layers, 16, page);
        add_prompt(fresh, prompt_tokens(16));  // a receiver that holds 2 of the 3 system pages
        const snapshot before(fresh);
        CHECK_THROWS_WITH_AS(import_pages(fresh, export_pages(prefill, source, 3)),
                             "kvcache: not_found: the export leaves out 3 pages but the cache's prefix cache holds "
                             "only the first 2 of them",
                             error);
        CHECK(snapshot(fresh) == before);
    }
}

TEST_CASE("an import that does not fit the receiver is refused with both sides named, the receiver unchanged") {
    paged_cache<half, heads> prefill(layers, 16, page);
    const sequence_id source = add_prompt(prefill, prompt_tokens(20));
    const page_export<half> sent = export_pages(prefill, source);
    const auto refused = [&](auto& cache, const page_export<half>& e, const std::string& message, int rank = 0,
                             int ranks = 1) {
        const snapshot before(cache);
        CHECK_THROWS_WITH_AS(import_pages(cache, e, rank, ranks), message.c_str(), error);
        CHECK(snapshot(cache) == before);
    };
    SUBCASE("other heads") {
        paged_cache<half, head_config<8, 4, 32>> other(layers, 16, page);
        page_export<half> e = sent;
        CHECK_THROWS_WITH_AS(import_pages(other, e), "kvcache: invalid_argument: the export's heads 8q/2kv/d32 differ "
                                                     "from the cache's 8q/4kv/d32", error);
        CHECK(other.sequences().empty());
    }
    SUBCASE("another page size, layer count or shard") {
        paged_cache<half, heads> pages16(layers, 16, 16), one_layer(1, 16, page), rank1(layers, 16, page);
        refused(pages16, sent, "kvcache: invalid_argument: the export's page_size 8 differs from the cache's 16");
        refused(one_layer, sent, "kvcache: invalid_argument: the export's layers 2 differ from the cache's 1");
        refused(rank1, sent,
                "kvcache: invalid_argument: the export holds tensor-parallel shard 0 of 1 but the cache is shard 1 "
                "of 2",
                1, 2);
    }
    SUBCASE("a damaged page, hash or count") {
        paged_cache<half, heads> decode(layers, 16, page);
        page_export<half> e = sent;
        e.payload[std::size_t(2) * page * row * 2 * layers + 5] = half(9.0f);  // a row of page 2
        refused(decode, e, "kvcache: format_error: page 2 of the export is damaged (checksum mismatch)");
        e = sent;
        e.tokens[3] += 1;
        refused(decode, e, "kvcache: format_error: page 0's hash in the export does not match its token ids");
        e = sent;
        e.payload.pop_back();
        refused(decode, e,
                "kvcache: format_error: the export's payload holds 5119 elements, short of page 2's end at 5120");
    }
    SUBCASE("a pool too small") {
        paged_cache<half, heads> small(layers, 2, page);
        refused(small, sent, "kvcache: capacity_exceeded: sequence 0 needs 3 pages; the pool of 2 has 2 free and 0 evictable");
    }
}

TEST_CASE("page exports as bytes refuse damage, truncation and the wrong element type") {
    paged_cache<float, heads> prefill(layers, 16, page);
    const auto bytes = to_bytes(export_pages(prefill, add_prompt(prefill, prompt_tokens(11))));
    auto damaged = bytes;
    damaged[100] ^= 1;
    CHECK_THROWS_WITH_AS(page_export_from_bytes<float>(damaged),
                         ("kvcache: format_error: the page export's " + std::to_string(bytes.size()) +
                          " bytes are damaged (checksum mismatch)").c_str(),
                         error);
    const std::vector<unsigned char> cut(bytes.begin(), bytes.begin() + 40);
    CHECK_THROWS_AS(page_export_from_bytes<float>(cut), error);
    CHECK_THROWS_WITH_AS(page_export_from_bytes<half>(bytes),
                         "kvcache: format_error: the page export holds fp32 rows, not fp16", error);
    const page_export<float> back = page_export_from_bytes<float>(bytes);
    CHECK(back.length == 11);
    CHECK(back.tokens == prompt_tokens(11));
}

/// The bytes of each carried page of an export, as the page checksums cover them.
template <class Element>
std::vector<std::string> page_bytes(const page_export<Element>& e) {
    std::vector<std::string> pages;
    const auto* at = reinterpret_cast<const char*>(e.payload.data());
    for (int p = e.first_page; p < e.page_count(); ++p) {
        const std::size_t n = e.page_elements(p) * sizeof(typename page_export<Element>::payload_element);
        pages.emplace_back(at, n);
        at += n;
    }
    return pages;
}

TEST_CASE("page exports carry the striped hash (version 3) and still read version 2's FNV-1a") {
    paged_cache<float, heads> prefill(layers, 16, page), decode(layers, 16, page);
    const sequence_id source = add_prompt(prefill, prompt_tokens(21));
    const page_export<float> sent = export_pages(prefill, source);
    const std::vector<std::string> pages = page_bytes(sent);
    REQUIRE(pages.size() == sent.page_checksums.size());
    for (std::size_t p = 0; p < pages.size(); ++p)  // the hash as docs/layouts.md defines it
        CHECK(sent.page_checksums[p] == test_support::documented_striped_hash(pages[p]));
    std::vector<unsigned char> bytes = to_bytes(sent);
    std::uint32_t version = 0;
    std::memcpy(&version, bytes.data() + 8, 4);
    CHECK(version == 3);
    const auto trailer = [](std::vector<unsigned char>& b, std::uint64_t sum) { std::memcpy(b.data() + b.size() - 8, &sum, 8); };
    const auto whole = [](const std::vector<unsigned char>& b) {
        return std::string(reinterpret_cast<const char*>(b.data()), b.size() - 8);
    };
    std::uint64_t frame = 0;
    std::memcpy(&frame, bytes.data() + bytes.size() - 8, 8);
    CHECK(frame == test_support::documented_striped_hash(whole(bytes)));

    // The same export as version 2 wrote it: FNV-1a page and frame checksums.
    page_export<float> old = sent;
    for (std::size_t p = 0; p < pages.size(); ++p) old.page_checksums[p] = test_support::documented_fnv1a(pages[p]);
    std::vector<unsigned char> old_bytes = to_bytes(old);
    version = 2;
    std::memcpy(old_bytes.data() + 8, &version, 4);
    trailer(old_bytes, test_support::documented_fnv1a(whole(old_bytes)));
    const page_export<float> back = page_export_from_bytes<float>(old_bytes);
    CHECK(back.page_checksums == sent.page_checksums);  // restated in the current hash, so import verifies them
    CHECK(same_rows(prefill, source, decode, import_pages(decode, back)));

    SUBCASE("a damaged page of a version 2 export") {
        page_export<float> damaged = old;
        damaged.payload[std::size_t(page) * row * 2 * layers + 7] += 1.0f;  // a row of page 1, after its checksum
        std::vector<unsigned char> b = to_bytes(damaged);
        std::memcpy(b.data() + 8, &version, 4);
        trailer(b, test_support::documented_fnv1a(whole(b)));
        CHECK_THROWS_WITH_AS(page_export_from_bytes<float>(b),
                             "kvcache: format_error: page 1 of the export is damaged (checksum mismatch)", error);
    }
    SUBCASE("a version this build does not read") {
        std::vector<unsigned char> b = bytes;
        version = 7;
        std::memcpy(b.data() + 8, &version, 4);
        CHECK_THROWS_WITH_AS(page_export_from_bytes<float>(b),
                             "kvcache: format_error: page export version 7 is not one this build reads (2 or 3)", error);
    }
}

TEST_CASE("fp8 pages carry their layers' scales and refuse a receiver with other scales") {
    paged_cache<float8_e4m3, heads> prefill(layers, 16, page), decode(layers, 16, page), other(layers, 16, page);
    for (auto* c : {&prefill, &decode}) c->set_scales(1, kv_scales{0.5f, 2.0f});
    other.set_scales(1, kv_scales{0.25f, 2.0f});
    const sequence_id source = add_prompt(prefill, prompt_tokens(19));
    const auto bytes = to_bytes(export_pages(prefill, source));
    const auto sent = page_export_from_bytes<float8_e4m3>(bytes);
    CHECK(same_rows(prefill, source, decode, import_pages(decode, sent)));
    CHECK_THROWS_WITH_AS(import_pages(other, sent),
                         "kvcache: invalid_argument: the export's scales of layer 1 (key 0.5, value 2) differ from the "
                         "cache's (key 0.25, value 2)",
                         error);
    CHECK(other.sequences().empty());
}

TEST_CASE("a swapped-out sequence exports from the host tier") {
    paged_cache<half, heads> prefill(layers, 16, page), decode(layers, 16, page);
    prefill.attach_host_tier(8);
    const sequence_id source = add_prompt(prefill, prompt_tokens(30));
    const auto before = export_pages(prefill, source);
    prefill.swap_out(source);
    const auto sent = export_pages(prefill, source);
    CHECK(sent.payload.size() == before.payload.size());
    CHECK(sent.page_checksums == before.page_checksums);
    const sequence_id id = import_pages(decode, sent);
    prefill.swap_in(source);
    CHECK(same_rows(prefill, source, decode, id));
}

/// The rows of the given positions of one layer, as floats: keys then values per position.
template <class Cache>
std::vector<float> rows_at(const Cache& cache, sequence_id id, int layer, const std::vector<int>& positions) {
    using element = typename Cache::element_type;
    std::vector<float> out;
    for (int p : positions) {
        std::vector<element> k(row), v(row);
        cache.read(id, layer, p, 1, span<element>(k), span<element>(v));
        for (const element& x : k) out.push_back(element_traits<element>::to_float(x));
        for (const element& x : v) out.push_back(element_traits<element>::to_float(x));
    }
    return out;
}

/// Rows of the positions one layer of a compacted sequence holds.
template <class Element>
std::vector<float> held_rows(const paged_cache<Element, heads>& cache, sequence_id id, int layer) {
    return rows_at(cache, id, layer, cache.present_positions(id, layer));
}

TEST_CASE("a compacted sequence exports the rows each layer kept, and imports compacted at the same positions") {
    paged_cache<half, heads> prefill(layers, 16, page), decode(layers, 16, page);
    const auto tokens = prompt_tokens(45);
    const sequence_id source = add_prompt(prefill, tokens);
    // Layer 0 keeps sinks, a run across a page boundary and the recent rows;
    // layer 1 keeps fewer, so the layers carry different counts per page.
    std::vector<int> keep0 = {0, 1, 2, 3, 6, 7, 8, 9, 30, 31};
    for (int p = 38; p < 45; ++p) keep0.push_back(p);
    const std::vector<int> keep1 = {0, 1, 17, 40, 41, 42, 43, 44};
    prefill.compact(source, {keep0, keep1});
    REQUIRE(prefill.compacted(source));

    const page_export<half> sent = export_pages(prefill, source);
    REQUIRE(sent.kept.size() == 2);
    CHECK(std::vector<int>(sent.kept[0].begin(), sent.kept[0].end()) == keep0);
    CHECK(std::vector<int>(sent.kept[1].begin(), sent.kept[1].end()) == keep1);
    CHECK(sent.payload_bytes() == (keep0.size() + keep1.size()) * row * 2 * sizeof(half));

    const auto used_before = decode.statistics().pages_used;
    const auto bytes = to_bytes(sent);
    const sequence_id id = import_pages(decode, page_export_from_bytes<half>(bytes));
    CHECK(decode.length(id) == 45);
    for (int l = 0; l < layers; ++l) {
        CHECK(decode.present_positions(id, l) == prefill.present_positions(source, l));
        CHECK(held_rows(decode, id, l) == held_rows(prefill, source, l));
    }
    // The receiver holds the pages of the layer keeping the most rows (17 of
    // them: 3 pages), not the 6 the whole length would take.
    CHECK(decode.statistics().pages_used - used_before == 3);
    // Attention over the kept rows is the same on both sides, in every layer.
    for (int l = 0; l < layers; ++l) CHECK(same_attention(prefill, source, decode, id, l));
    // The sequence goes on growing on the receiver.
    const int at = decode.begin_append(id, 1);
    CHECK(at == 45);
    CHECK(decode.visible_count(id, 1) == int(keep1.size()) + 1);

    SUBCASE("a compacted sequence exports whole") {
        CHECK_THROWS_WITH_AS(export_pages(prefill, source, 1),
                             "kvcache: invalid_argument: sequence 0 was compacted, so it exports whole; first_page = 1 "
                             "would leave out pages",
                             error);
    }
    SUBCASE("kept positions out of order are refused, the receiver unchanged") {
        page_export<half> bad = sent;
        std::swap(bad.kept[1][2], bad.kept[1][3]);
        const snapshot before(decode);
        CHECK_THROWS_WITH_AS(import_pages(decode, bad),
                             "kvcache: format_error: layer 1's kept position 17 (entry 3) is not ascending within [0, 45)",
                             error);
        CHECK(snapshot(decode) == before);
    }
    SUBCASE("a compacted export into a pool too small for its whole length is refused, the receiver unchanged") {
        paged_cache<half, heads> small(layers, 5, page);
        const snapshot before(small);
        CHECK_THROWS_AS(import_pages(small, sent), error);
        CHECK(snapshot(small) == before);
        CHECK(small.statistics().pages_cached == 0);
    }
}

/// A sliding-window cache of the test's heads holding `n` tokens' rows, appended a chunk at a time.
template <class Element>
sequence_id add_window_sequence(sliding_window_cache<Element, heads>& cache, int n) {
    const sequence_id id = cache.add_sequence();
    for (int done = 0; done < n;) {
        const int count = std::min(cache.max_chunk(), n - done);
        const int at = cache.begin_append(id, count);
        for (int l = 0; l < layers; ++l) {
            std::vector<float> k(std::size_t(count) * row), v(k.size());
            for (int t = 0; t < count; ++t)
                for (int i = 0; i < row; ++i) {
                    k[std::size_t(t) * row + i] = row_value(5000 + at + t, at + t, l, 0, i);
                    v[std::size_t(t) * row + i] = row_value(5000 + at + t, at + t, l, 1, i);
                }
            cache.write(id, l, at, span<const float>(k), span<const float>(v), count);
        }
        done += count;
    }
    return id;
}

template <class Element>
std::vector<float> window_rows(const sliding_window_cache<Element, heads>& cache, sequence_id id, int layer) {
    return rows_at(cache, id, layer, cache.present_positions(id));
}

TEST_CASE("a sliding-window sequence goes through bytes into another window cache and attends there as it did") {
    // sinks 4, window 8, chunks of 3: a ring of 10 rows.
    sliding_window_cache<half, heads> prefill(layers, 2, 8, 4, 3), decode(layers, 2, 8, 4, 3);
    const sequence_id source = add_window_sequence(prefill, 40);
    const page_export<half> sent = export_pages(prefill, source);
    CHECK(sent.layout == layout_kind::sliding_window);
    CHECK(sent.payload_bytes() == std::size_t(14) * row * 2 * layers * sizeof(half));  // 4 sinks + 10 ring rows
    const auto bytes = to_bytes(sent);
    const sequence_id id = import_pages(decode, page_export_from_bytes<half>(bytes));
    CHECK(decode.length(id) == 40);
    CHECK(decode.present_positions(id) == prefill.present_positions(source));
    for (int l = 0; l < layers; ++l) CHECK(window_rows(decode, id, l) == window_rows(prefill, source, l));
    CHECK(same_attention(prefill, source, decode, id, 1));

    SUBCASE("a short sequence (nothing evicted yet) too") {
        const sequence_id young = add_window_sequence(prefill, 9);
        const sequence_id copy = import_pages(decode, export_pages(prefill, young));
        CHECK(decode.present_positions(copy) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8});
        for (int l = 0; l < layers; ++l) CHECK(window_rows(decode, copy, l) == window_rows(prefill, young, l));
    }
    SUBCASE("a window of other sinks or ring is refused, naming both, the receiver unchanged") {
        sliding_window_cache<half, heads> other(layers, 2, 8, 2, 3);
        CHECK_THROWS_WITH_AS(import_pages(other, sent),
                             "kvcache: invalid_argument: layer 0 of the export holds position 2, which this window "
                             "(sinks 2, ring 10) does not keep in a sequence of 40 tokens (the export names 14 "
                             "positions, the window keeps 12)",
                             error);
        CHECK(other.sequences().empty());
    }
    SUBCASE("another layout is refused: a window export into a paged cache and the reverse") {
        paged_cache<half, heads> paged(layers, 16, page);
        CHECK_THROWS_WITH_AS(import_pages(paged, sent),
                             "kvcache: invalid_argument: the export holds a sliding_window sequence but the cache is paged",
                             error);
        CHECK(paged.sequences().empty());
        const auto paged_export = export_pages(paged, add_prompt(paged, prompt_tokens(9)));
        sliding_window_cache<half, heads> window(layers, 2, 8, 4, 3);
        CHECK_THROWS_WITH_AS(import_pages(window, paged_export),
                             "kvcache: invalid_argument: the export holds a paged sequence but the cache is sliding_window",
                             error);
        CHECK(window.sequences().empty());
    }
    SUBCASE("a compacted sequence imports with the same holes and attends there as it did") {
        // Visible rows: sinks 0-3, ring 30-39; keep sinks 0 and 2 and ring positions 31, 35, 38, 39.
        prefill.compact(source, std::vector<std::vector<int>>(std::size_t(layers), std::vector<int>{0, 2, 5, 9, 12, 13}));
        const page_export<half> compacted = export_pages(prefill, source);
        CHECK(compacted.payload_bytes() == std::size_t(6) * row * 2 * layers * sizeof(half));
        const auto compacted_bytes = to_bytes(compacted);
        const sequence_id copy = import_pages(decode, page_export_from_bytes<half>(compacted_bytes));
        CHECK(decode.compacted(copy));
        CHECK(decode.present_positions(copy) == std::vector<int>{0, 2, 31, 35, 38, 39});
        for (int l = 0; l < layers; ++l) {
            CHECK(decode.visible_count(copy, l) == 6);
            CHECK(window_rows(decode, copy, l) == window_rows(prefill, source, l));
        }
        CHECK(same_attention(prefill, source, decode, copy, 1));
    }
    SUBCASE("a window cache with no free slot refuses it") {
        sliding_window_cache<half, heads> full(layers, 1, 8, 4, 3);
        add_window_sequence(full, 2);
        CHECK_THROWS_AS(import_pages(full, sent), error);
        CHECK(full.sequences().size() == 1);
    }
}

TEST_CASE("a cached prefix chain exports without a sequence and enters another cache's prefix cache only") {
    paged_cache<half, heads> prefill(layers, 16, page), store(layers, 16, page);
    const auto system = prompt_tokens(27);  // 3 full pages and 3 rows
    prefill.remove_sequence(add_prompt(prefill, system));  // served and gone: only the prefix cache holds its pages
    REQUIRE(prefill.sequences().empty());
    auto asked = system;
    asked.push_back(7);  // a new request's prompt: the system prompt and more
    const page_export<half> chain = export_prefix(prefill, asked);
    CHECK(prefill.sequences().empty());
    CHECK(chain.length == 24);
    CHECK(chain.page_hashes.size() == 3);
    CHECK(chain.tokens == std::vector<std::int32_t>(system.begin(), system.begin() + 24));

    const auto bytes = to_bytes(chain);
    CHECK(import_prefix(store, page_export_from_bytes<half>(bytes)) == 24);
    CHECK(store.sequences().empty());
    CHECK(store.statistics().pages_cached == 3);
    // A request on the store finds the chain and attends over the same rows.
    const sequence_id hit = store.add_sequence();
    CHECK(store.match_prefix(hit, asked) == 24);
    const sequence_id there = prefill.add_sequence();
    CHECK(prefill.match_prefix(there, asked) == 24);
    CHECK(same_rows(prefill, there, store, hit));

    SUBCASE("nothing cached: an empty chain") {
        const auto none = export_prefix(prefill, prompt_tokens(20, 3));
        CHECK(none.length == 0);
        CHECK(none.payload.empty());
        CHECK(import_prefix(store, none) == 0);
    }
    SUBCASE("a cache without prefix caching is refused, unchanged") {
        paged_cache<half, heads> plain(layers, 16, page, /*prefix_caching=*/false);
        CHECK_THROWS_WITH_AS(import_prefix(plain, chain),
                             "kvcache: invalid_argument: import_prefix needs a cache with prefix caching; this one has none",
                             error);
        CHECK(plain.statistics().pages_used == 0);
    }
}

}  // namespace
