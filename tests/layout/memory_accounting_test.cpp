// Memory accounting on a realistic mix of sequence lengths: the paged pool's
// reserved and used bytes against the contiguous layout's reservation. The
// figures are printed (they go to the bench); the checks are the formulas.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kvcache/cache.hpp"

TEST_CASE("paged vs contiguous reservation on a realistic mix") {
    // One tiny layer keeps the test light; every byte figure scales by the
    // same factor (layers x kv_heads x head_dim x element size) for both layouts.
    using heads = kvcache::head_config<1, 1, 8>;
    using element = kvcache::half;
    const int sequences = 64, max_length = 4096, page_size = 16;
    // Chat-like lengths: log-normal around ~600 tokens, clipped to the context.
    std::mt19937 random(2024);
    std::lognormal_distribution<double> length_of(std::log(600.0), 0.9);
    std::vector<int> lengths;
    long long tokens = 0, pages_needed = 0;
    for (int i = 0; i < sequences; ++i) {
        const int n = std::clamp(static_cast<int>(length_of(random)), 1, max_length);
        lengths.push_back(n);
        tokens += n;
        pages_needed += (n + page_size - 1) / page_size;
    }
    const std::size_t row_bytes = 2 * heads::kv_heads() * heads::head_dim * sizeof(element);  // K and V

    kvcache::paged_cache<element, heads> paged(1, static_cast<int>(pages_needed), page_size, false);
    kvcache::static_cache<element, heads> contiguous(1, sequences, max_length);
    for (int n : lengths) {
        const auto p = paged.add_sequence();
        paged.begin_append(p, n);
        const auto c = contiguous.add_sequence();
        contiguous.begin_append(c, n);
    }
    const auto stats = paged.statistics();
    CHECK(stats.pages_used == pages_needed);
    CHECK(stats.bytes_used == std::size_t(pages_needed) * page_size * row_bytes);
    CHECK(stats.bytes_reserved == stats.bytes_used);
    CHECK(contiguous.bytes_reserved() == std::size_t(sequences) * max_length * row_bytes);
    CHECK(contiguous.bytes_used() == std::size_t(tokens) * row_bytes);
    // Paged waste is only the unfilled tail of each last page.
    CHECK(stats.bytes_used - std::size_t(tokens) * row_bytes < std::size_t(sequences) * page_size * row_bytes);

    // The same mix for a 7B-class model: 32 layers, 8 KV heads of 128, fp16.
    const double scale = 32.0 * 8 * 128 / (heads::kv_heads() * heads::head_dim);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    MESSAGE("mix: ", sequences, " sequences, ", tokens, " tokens (mean ", tokens / sequences, ", max context ",
            max_length, "), page size ", page_size);
    MESSAGE("bytes of live K/V:            ", tokens * row_bytes, "  (7B-class: ", tokens * row_bytes * scale / gib,
            " GiB)");
    MESSAGE("paged, used (= pool sized to fit): ", stats.bytes_used, "  (7B-class: ", stats.bytes_used * scale / gib,
            " GiB, ", 100.0 * (stats.bytes_used - tokens * row_bytes) / stats.bytes_used, "% tail waste)");
    MESSAGE("contiguous reservation:       ", contiguous.bytes_reserved(), "  (7B-class: ",
            contiguous.bytes_reserved() * scale / gib, " GiB, ",
            double(contiguous.bytes_reserved()) / stats.bytes_used, "x the paged pool)");
}
