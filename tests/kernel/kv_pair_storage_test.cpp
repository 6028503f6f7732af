// Keys and values stored in two types (kv_elements<Key, Value>, llama.cpp's
// -ctk / -ctv): the runtime kinds and their file encoding; every owner stores
// each side exactly as a cache of that side's type stores it (the same bytes,
// compared with twin caches of one type, never with expected bytes computed
// here from the library); the view's key() and value() reach those rows; fork,
// copy on write, compaction, swap, the host and disk tiers, save / load and
// page export carry both sides; mismatched files, exports, scales and buffer
// sizes are refused naming the kinds, with nothing changed.
#include <doctest/doctest.h>

#include <filesystem>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "kvcache/cache/contiguous_cache.hpp"
#include "kvcache/cache/page_transfer.hpp"
#include "kvcache/cache/paged_cache.hpp"
#include "kvcache/cache/sliding_window_cache.hpp"
#include "kvcache/configuration/dispatch.hpp"
#include "kvcache/configuration/presets.hpp"
#include "kvcache/core/kv_elements.hpp"
#include "support/storage_owners.hpp"

using namespace kvcache;
using kvcache_test::random_rows;

namespace {

using heads = head_config<4, 2, 40>;  // head_dim 40: int4's last group is short
constexpr int dim = heads::head_dim, kv = 2;

const element_kind all_kinds[] = {element_kind::fp32,     element_kind::fp16,     element_kind::bf16, element_kind::fp8_e4m3,
                                  element_kind::fp8_e5m2, element_kind::int8,     element_kind::int4};

/// One layer's stored rows of one side of a sequence, [token][kv_head][row] as the owner reads them.
template <class Cache>
struct stored_rows {
    std::vector<typename Cache::key_type> keys;
    std::vector<typename Cache::value_type> values;
};

/// The rows of every position the sequence holds (a window's present ones), in position order.
template <class Cache>
stored_rows<Cache> rows_of(const Cache& cache, sequence_id id, int layer) {
    using key = typename Cache::key_type;
    using value = typename Cache::value_type;
    constexpr std::size_t key_row = std::size_t(kv) * row_elements<key>(dim), value_row = std::size_t(kv) * row_elements<value>(dim);
    stored_rows<Cache> r;
    for (int p : cache.present_positions(id)) {
        r.keys.resize(r.keys.size() + key_row);
        r.values.resize(r.values.size() + value_row);
        cache.read(id, layer, p, 1, span<key>(r.keys.data() + r.keys.size() - key_row, key_row),
                   span<value>(r.values.data() + r.values.size() - value_row, value_row));
    }
    return r;
}

template <class A, class B>
bool same_bytes(const std::vector<A>& a, const std::vector<B>& b) {
    return a.size() * sizeof(A) == b.size() * sizeof(B) && std::memcmp(a.data(), b.data(), a.size() * sizeof(A)) == 0;
}

/// Every visible row of one side of two views, byte for byte: the pair view's
/// key() (or value()) rows against a one-type view's. Returns the rows that differ.
template <bool Keys, class PairView, class PlainView>
int differing_side(const PairView& pair, const PlainView& plain) {
    using side = std::conditional_t<Keys, typename PairView::key_type, typename PairView::value_type>;
    constexpr int bytes = row_elements<side>(dim) * int(sizeof(side));
    int differing = 0;
    REQUIRE(pair.sequence_count() == plain.sequence_count());
    for (int s = 0; s < pair.sequence_count(); ++s) {
        REQUIRE(pair.visible_count(s) == plain.visible_count(s));
        for (int h = 0; h < kv; ++h)
            for (int i = 0; i < pair.visible_count(s); ++i) {
                const int p = pair.visible_position(s, i);
                REQUIRE(p == plain.visible_position(s, i));
                const void* a = Keys ? static_cast<const void*>(pair.key(s, h, p)) : static_cast<const void*>(pair.value(s, h, p));
                const void* b = Keys ? static_cast<const void*>(plain.key(s, h, p)) : static_cast<const void*>(plain.value(s, h, p));
                differing += std::memcmp(a, b, bytes) != 0;
            }
    }
    return differing;
}

/// A pair cache and a cache of each side's type, built alike, fed the same float rows.
template <class Key, class Value, template <class, class> class Owners>
struct twins {
    using pair_cache = decltype(Owners<kv_elements<Key, Value>, heads>::make());
    pair_cache pair = Owners<kv_elements<Key, Value>, heads>::make();
    decltype(Owners<Key, heads>::make()) keys = Owners<Key, heads>::make();
    decltype(Owners<Value, heads>::make()) values = Owners<Value, heads>::make();
    std::vector<sequence_id> ids;
    int salt = 0;

    /// A new sequence in all three, of n tokens.
    void add(int n) {
        const sequence_id a = pair.add_sequence(), b = keys.add_sequence(), c = values.add_sequence();
        REQUIRE(a == b);
        REQUIRE(a == c);
        ids.push_back(a);
        append(a, n);
    }
    /// n more tokens on sequence id in all three (the same float keys and values).
    void append(sequence_id id, int n) {
        ++salt;
        const auto k = random_rows(std::size_t(n) * kv * dim, unsigned(100 + salt));
        const auto v = random_rows(std::size_t(n) * kv * dim, unsigned(200 + salt));
        for (int l = 0; l < pair.layers(); ++l) {
            pair.append(id, l, k, v, n);
            keys.append(id, l, k, v, n);
            values.append(id, l, k, v, n);
        }
    }
    /// The pair's key rows are the key-type cache's, its value rows the value-type cache's, in every layer.
    void check_rows(const std::string& when) const {
        CAPTURE(when);
        for (sequence_id id : ids)
            for (int l = 0; l < pair.layers(); ++l) {
                CAPTURE(id);
                CAPTURE(l);
                const auto p = rows_of(pair, id, l);
                CHECK(same_bytes(p.keys, rows_of(keys, id, l).keys));
                CHECK(same_bytes(p.values, rows_of(values, id, l).values));
            }
    }
    /// The same through the views of every layer: key() and value() of the pair view address those rows.
    template <class PairCache, class KeyCache, class ValueCache>
    static void check_views(PairCache& pair, KeyCache& keys, ValueCache& values, const std::vector<sequence_id>& ids) {
        for (int l = 0; l < pair.layers(); ++l) {
            const auto p = pair.plan(ids), k = keys.plan(ids), v = values.plan(ids);
            CHECK(differing_side<true>(p.view(l), k.view(l)) == 0);
            CHECK(differing_side<false>(p.view(l), v.view(l)) == 0);
            CHECK(differing_side<true>(p.view(l).read_only(), k.view(l).read_only()) == 0);
        }
    }
    void check_views() { check_views(pair, keys, values, ids); }
};

template <class Element, class Heads>
struct contiguous_owners {
    static contiguous_cache<Element, Heads> make() { return {2, 3, 64}; }
};
template <class Element, class Heads>
struct paged_owners {
    static paged_cache<Element, Heads> make() { return {2, 48, 4}; }
};
template <class Element, class Heads>
struct window_owners {
    static sliding_window_cache<Element, Heads> make() { return {2, 3, 4, 2, 10}; }  // a ring of 13 rows
};

template <class Key, class Value>
void check_every_layout() {
    const std::string pair_name = element_name<kv_elements<Key, Value>>();
    CAPTURE(pair_name);
    {
        twins<Key, Value, contiguous_owners> t;
        t.add(13);
        t.add(7);
        t.append(t.ids[0], 5);
        t.check_rows("contiguous");
        t.check_views();
        const sequence_id child = t.pair.fork(t.ids[0]);
        CHECK(same_bytes(rows_of(t.pair, child, 1).values, rows_of(t.pair, t.ids[0], 1).values));
    }
    {
        twins<Key, Value, paged_owners> t;
        t.add(13);  // 3 full pages and one partial
        t.add(6);
        t.check_rows("paged");
        t.check_views();
    }
    {
        twins<Key, Value, window_owners> t;
        t.add(9);
        t.add(4);
        t.append(t.ids[0], 9);  // past the ring: positions dropped, the ring wrapped
        t.append(t.ids[0], 3);
        t.check_rows("sliding window");
        t.check_views();
    }
}

}  // namespace

TEST_CASE("kv_kinds: names, parsing, the file encoding of every pair, and the traits of kv_elements") {
    CHECK(kv_kinds(element_kind::int8).to_string() == "int8");
    CHECK(kv_kinds(element_kind::int8, element_kind::int4).to_string() == "int8+int4");
    CHECK_FALSE(kv_kinds(element_kind::fp16).mixed());
    kv_kinds k;
    REQUIRE(parse_kv_kinds("fp16+int4", k));
    CHECK(k == kv_kinds(element_kind::fp16, element_kind::int4));
    REQUIRE(parse_kv_kinds("fp8+e5m2", k));  // each side takes parse_element_kind's names
    CHECK(k == kv_kinds(element_kind::fp8_e4m3, element_kind::fp8_e5m2));
    REQUIRE(parse_kv_kinds("bf16", k));
    CHECK(k == kv_kinds(element_kind::bf16));
    REQUIRE(parse_kv_kinds("fp16+half", k));  // one kind twice is that kind
    CHECK_FALSE(k.mixed());
    for (const char* bad : {"", "+", "int8+", "+int4", "int8+int5", "q8_0", "int8+int4+fp16"}) {
        CAPTURE(bad);
        kv_kinds untouched(element_kind::bf16);
        CHECK_FALSE(parse_kv_kinds(bad, untouched));
        CHECK(untouched == kv_kinds(element_kind::bf16));
    }
    // Every pair of kinds encodes to a value that decodes to it; a kind alone keeps the u32
    // every earlier file holds (the kind itself), so old files still load.
    int decoded = 0;
    for (element_kind key : all_kinds)
        for (element_kind value : all_kinds) {
            const kv_kinds kinds(key, value);
            const unsigned recorded = encode_kv_kinds(kinds);
            if (key == value) CHECK(recorded == unsigned(key));
            kv_kinds back;
            REQUIRE(decode_kv_kinds(recorded, back));
            CHECK(back == kinds);
            ++decoded;
        }
    CHECK(decoded == 49);
    kv_kinds back;
    CHECK_FALSE(decode_kv_kinds(7, back));                             // no kind 7
    CHECK_FALSE(decode_kv_kinds(5u | (5u + 1u) << 8, back));            // int8+int8 is written as int8
    CHECK_FALSE(decode_kv_kinds(5u | (9u + 1u) << 8, back));            // no value kind 9
    CHECK(detail::element_name(5u | (6u + 1u) << 8) == "int8+int4");
    CHECK(detail::element_name(77) == "unknown");

    using pair = kv_elements<qint8, qint4>;
    static_assert(std::is_same_v<key_element_t<pair>, qint8> && std::is_same_v<value_element_t<pair>, qint4>);
    static_assert(std::is_same_v<key_element_t<const pair>, const qint8>);
    static_assert(std::is_same_v<key_element_t<half>, half> && std::is_same_v<value_element_t<half>, half>);
    static_assert(is_kv_pair_v<pair> && !is_kv_pair_v<half> && is_cache_element_v<pair>);
    static_assert(std::is_same_v<default_activation_t<kv_elements<float, qint8>>, float>);
    static_assert(std::is_same_v<default_activation_t<pair>, half>);
    CHECK(kinds_of<pair>() == kv_kinds(element_kind::int8, element_kind::int4));
    CHECK(element_name<kv_elements<half, qint8>>() == "fp16+int8");
    // Bytes a token takes in a layer: each side's stored row (int8: 40 + 4; int4: 20 codes + 2 groups x 4).
    CHECK(stored_token_bytes(kinds_of<pair>(), kv, dim) == kv * ((40 + 4) + (20 + 8)));
    CHECK(stored_token_bytes(kv_kinds(element_kind::fp16), kv, dim) == kv * 2 * 80);
}

TEST_CASE("kv_elements caches store each side as a cache of that side's type does, in every layout") {
    check_every_layout<qint8, qint4>();
    check_every_layout<half, qint4>();
    check_every_layout<half, qint8>();
    check_every_layout<qint4, float>();  // the pair may put the finer type on either side
    check_every_layout<float8_e5m2, bfloat16>();
}

TEST_CASE("kv_elements paged caches: fork and copy on write, compaction, swap, the host and disk tiers") {
    twins<half, qint4, paged_owners> t;
    t.pair.attach_host_tier(16);
    t.keys.attach_host_tier(16);
    t.values.attach_host_tier(16);
    t.add(10);
    // A fork shares the full pages; appending to the child copies the shared partial page.
    const sequence_id child = t.pair.fork(t.ids[0]);
    REQUIRE(t.keys.fork(t.ids[0]) == child);
    REQUIRE(t.values.fork(t.ids[0]) == child);
    t.ids.push_back(child);
    t.append(child, 3);
    t.check_rows("after fork and copy on write");
    CHECK(t.pair.pages(child)[0] == t.pair.pages(t.ids[0])[0]);
    CHECK(t.pair.pages(child)[2] != t.pair.pages(t.ids[0])[2]);

    t.pair.compact(t.ids[0], 1, {0, 2, 5, 9});
    t.keys.compact(t.ids[0], 1, {0, 2, 5, 9});
    t.values.compact(t.ids[0], 1, {0, 2, 5, 9});
    twins<half, qint4, paged_owners>::check_views(t.pair, t.keys, t.values, t.ids);

    const auto before = rows_of(t.pair, child, 0);
    t.pair.swap_out(child);
    CHECK(t.pair.swapped_out(child));
    const auto swapped = rows_of(t.pair, child, 0);  // read() of a swapped sequence reads the host tier
    CHECK(same_bytes(swapped.keys, before.keys));
    CHECK(same_bytes(swapped.values, before.values));
    t.pair.swap_in(child);
    const auto back = rows_of(t.pair, child, 0);
    CHECK(same_bytes(back.keys, before.keys));
    CHECK(same_bytes(back.values, before.values));
}

TEST_CASE("kv_elements paged caches: a prefix spilled to the host tier and to disk comes back with both sides") {
    using cache_type = paged_cache<kv_elements<qint8, qint4>, heads>;
    const auto path = std::filesystem::temp_directory_path() / "kvcache_kv_pair_storage_test_disk";
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
    const std::string directory = path.string();
    cache_type cache(2, 6, 4);  // 6 pages: a second prompt of 5 pages evicts the first's
    cache.attach_host_tier(1);  // room for one spilled page; the rest go to disk
    cache.attach_disk_tier(directory, 8);
    std::vector<std::int32_t> prompt(20), other(20);
    for (int i = 0; i < 20; ++i) prompt[std::size_t(i)] = 7 + i, other[std::size_t(i)] = 500 + i;
    const auto k = random_rows(std::size_t(20) * kv * dim, 11), v = random_rows(std::size_t(20) * kv * dim, 12);
    const auto stored_rows_of = [&](sequence_id id) { return rows_of(cache, id, 1); };

    const sequence_id first = cache.add_sequence();
    cache.begin_append(first, 20, prompt);  // the token ids make its full pages a cached prefix
    for (int l = 0; l < 2; ++l) cache.write(first, l, 0, k, v, 20);
    const auto expected = stored_rows_of(first);
    cache.remove_sequence(first);  // its full pages stay cached
    const sequence_id second = cache.add_sequence();
    cache.begin_append(second, 20, other);  // evicts the first prompt's pages: one to the host tier, the rest to disk
    for (int l = 0; l < 2; ++l) cache.write(second, l, 0, k, v, 20);
    cache.remove_sequence(second);
    const auto st = cache.statistics();
    CHECK(st.disk_pages_used > 0);

    const sequence_id again = cache.add_sequence();
    const int matched = cache.match_prefix(again, std::vector<std::int32_t>(prompt.begin(), prompt.end()));
    CHECK(matched == 20);  // all five full pages, from the host and disk tiers
    CHECK(cache.statistics().disk_prefix_hit_pages > 0);
    const auto got = stored_rows_of(again);
    const std::size_t key_part = std::size_t(matched) * kv * row_elements<qint8>(dim);
    const std::size_t value_part = std::size_t(matched) * kv * row_elements<qint4>(dim);
    REQUIRE(got.keys.size() == key_part);
    CHECK(std::memcmp(got.keys.data(), expected.keys.data(), key_part) == 0);
    CHECK(std::memcmp(got.values.data(), expected.values.data(), value_part) == 0);
}

namespace {

/// A pair cache saved and loaded into a fresh one (every layout), then exported and imported
/// (paged, sliding window): both sides' rows come back byte for byte.
template <class Key, class Value, template <class, class> class Owners>
void check_round_trips() {
    const std::string pair_name = element_name<kv_elements<Key, Value>>();
    CAPTURE(pair_name);
    twins<Key, Value, Owners> t;
    t.add(9);
    t.add(4);
    std::stringstream file;
    t.pair.save(file);
    auto loaded = Owners<kv_elements<Key, Value>, heads>::make();
    const std::vector<sequence_id> ids = loaded.load(file);
    REQUIRE(ids.size() == 2);
    for (std::size_t i = 0; i < ids.size(); ++i)
        for (int l = 0; l < 2; ++l) {
            CHECK(same_bytes(rows_of(loaded, ids[i], l).keys, rows_of(t.pair, t.ids[i], l).keys));
            CHECK(same_bytes(rows_of(loaded, ids[i], l).values, rows_of(t.pair, t.ids[i], l).values));
        }
    if constexpr (!std::is_same_v<decltype(loaded), contiguous_cache<kv_elements<Key, Value>, heads>>) {
        const auto wire = to_bytes(export_pages(t.pair, t.ids[0]));
        auto receiver = Owners<kv_elements<Key, Value>, heads>::make();
        const sequence_id imported =
            import_pages(receiver, page_export_from_bytes<kv_elements<Key, Value>>(span<const unsigned char>(wire)));
        for (int l = 0; l < 2; ++l) {
            CHECK(same_bytes(rows_of(receiver, imported, l).keys, rows_of(t.pair, t.ids[0], l).keys));
            CHECK(same_bytes(rows_of(receiver, imported, l).values, rows_of(t.pair, t.ids[0], l).values));
        }
    }
}

}  // namespace

TEST_CASE("kv_elements caches: save and load, and page exports, carry both sides in every layout") {
    check_round_trips<qint8, qint4, paged_owners>();
    check_round_trips<half, qint4, paged_owners>();  // sides of two element sizes
    check_round_trips<float, qint8, contiguous_owners>();
    check_round_trips<qint4, bfloat16, window_owners>();
}

TEST_CASE("kv_elements caches: mismatched files and page exports are refused with nothing changed") {
    using pair = kv_elements<qint8, qint4>;
    twins<qint8, qint4, paged_owners> t;
    t.add(9);
    t.add(4);
    std::stringstream file;
    t.pair.save(file);
    const std::string bytes = file.str();
    paged_cache<pair, heads> loaded(2, 48, 4);
    std::stringstream in(bytes);
    REQUIRE(loaded.load(in).size() == 2);

    // Into a cache of the key type, of another pair, and a one-type file into a pair cache.
    const auto refused = [](auto& cache, const std::string& contents, const std::string& says) {
        std::stringstream s(contents);
        const std::size_t sequences = cache.sequence_count();
        CHECK_THROWS_WITH_AS(cache.load(s), doctest::Contains(says.c_str()), error);
        CHECK(cache.sequence_count() == sequences);
    };
    paged_cache<qint8, heads> int8_only(2, 48, 4);
    refused(int8_only, bytes, "file holds int8+int4 elements (element kind 1797), the cache stores int8 (element kind 5)");
    paged_cache<kv_elements<half, qint4>, heads> other_pair(2, 48, 4);
    refused(other_pair, bytes, "file holds int8+int4 elements (element kind 1797), the cache stores fp16+int4");
    std::stringstream plain_file;
    t.keys.save(plain_file);
    refused(loaded, plain_file.str(), "file holds int8 elements (element kind 5), the cache stores int8+int4");

    // A page export records both kinds; a receiver of another type refuses its bytes, and import refuses
    // an export whose kinds are not the cache's.
    const auto exported = export_pages(t.pair, t.ids[0]);
    CHECK(exported.element == kv_kinds(element_kind::int8, element_kind::int4));
    const auto wire = to_bytes(exported);
    const auto read_back = page_export_from_bytes<pair>(span<const unsigned char>(wire));
    paged_cache<pair, heads> receiver(2, 48, 4);
    (void)import_pages(receiver, read_back);
    CHECK_THROWS_WITH_AS(page_export_from_bytes<qint8>(span<const unsigned char>(wire)),
                         doctest::Contains("the page export holds int8+int4 rows, not int8"), error);
    // An export whose kinds were changed on the way (a sender of another build) is refused by import.
    auto relabelled = read_back;
    relabelled.element = kv_kinds(element_kind::int8, element_kind::fp16);
    CHECK_THROWS_WITH_AS(import_pages(receiver, relabelled),
                         doctest::Contains("the export holds int8+fp16 rows but the cache stores int8+int4"), error);
    CHECK(receiver.sequence_count() == 1);
}

TEST_CASE("kv_elements caches: scales only on an fp8 side, buffers sized per side, each refusal changing nothing") {
    paged_cache<kv_elements<float8_e4m3, qint4>, heads> fp8_keys(2, 8, 4);
    fp8_keys.set_scales(1, {0.5f, 1.0f});  // the fp8 keys take a scale; the int4 values stay at 1
    CHECK(fp8_keys.scales(1).key == 0.5f);
    CHECK_THROWS_WITH_AS(fp8_keys.set_scales(0, {0.5f, 2.0f}),
                         doctest::Contains("set_scales on layer 0: value scale 2 for values stored as int4, which take no scale (1 only)"),
                         error);
    CHECK(fp8_keys.scales(0).key == 1.0f);
    paged_cache<kv_elements<half, qint8>, heads> no_fp8(2, 8, 4);
    CHECK_THROWS_WITH_AS(no_fp8.set_scales(0, {2.0f, 1.0f}),
                         doctest::Contains("a fp16+int8 cache stores values as they are (only fp8 caches take scales)"),
                         error);

    // Stored rows are sized per side: a values buffer sized like the keys is refused, naming it.
    paged_cache<kv_elements<qint8, qint4>, heads> cache(2, 8, 4);
    const sequence_id id = cache.add_sequence();
    const std::vector<qint8> keys(std::size_t(2) * kv * row_elements<qint8>(dim));
    const std::vector<qint4> short_values(std::size_t(2) * kv * row_elements<qint8>(dim) / 2);
    CHECK_THROWS_WITH_AS(cache.append(id, 0, span<const qint8>(keys), span<const qint4>(short_values), 2),
                         doctest::Contains("values"), error);
    CHECK(cache.length(id) == 0);
    const std::vector<qint4> values(std::size_t(2) * kv * row_elements<qint4>(dim));
    cache.append(id, 0, span<const qint8>(keys), span<const qint4>(values), 2);
    CHECK(cache.length(id) == 2);
}

TEST_CASE("kv_elements reach the dispatcher: runtime kinds pick the compiled pair, and an uncompiled pair is refused") {
    static_assert(cache_element_choices::size == cache_elements::size + kv_element_pairs::size);
    const runtime_configuration wanted{layout_kind::paged, kv_kinds(element_kind::int8, element_kind::int4), {32, 8, 128}};
    CHECK(wanted.to_string() == "paged/int8+int4/32q/8kv/d128");
    CHECK(supports(dynamic_configurations{}, wanted));
    CHECK(supports(dynamic_configurations{}, {layout_kind::contiguous, kv_kinds(element_kind::fp16, element_kind::int8), {8, 2, 64}}));
    CHECK_FALSE(supports(dynamic_configurations{}, {layout_kind::paged, kv_kinds(element_kind::int4, element_kind::int8), {32, 8, 128}}));
    using candidates = type_list<configuration<paged_layout, qint8, dynamic_heads<128>>,
                                 configuration<paged_layout, kv_elements<qint8, qint4>, dynamic_heads<128>>,
                                 configuration<paged_layout, kv_elements<half, qint4>, dynamic_heads<128>>>;
    const std::string chosen = dispatch(candidates{}, wanted, [](auto config) { return name_of<decltype(config)>(); });
    CHECK(chosen == "paged/int8+int4/dynamicq/dynamickv/d128");
    CHECK_THROWS_WITH_AS(
        dispatch(candidates{}, {layout_kind::paged, kv_kinds(element_kind::int4, element_kind::int8), {32, 8, 128}},
                 [](auto) { return 0; }),
        doctest::Contains("paged/int4+int8/32q/8kv/d128"), error);
}
