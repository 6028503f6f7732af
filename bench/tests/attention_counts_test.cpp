// The bench's byte and FLOP counts against numbers worked out by hand for a
// few shapes (the arithmetic is in each comment), and the causal key count
// against a loop over the queries: the figures every bandwidth and FLOP/s
// column divides by.
#include <doctest/doctest.h>

#include <initializer_list>

#include "support/attention_counts.hpp"

using namespace kvcache;
using namespace kvcache::bench;

TEST_CASE("decode bytes: paged fp16 GQA 32/8 d128, batch 64 x 8K") {
    const attention_shape s{layout_kind::paged, element_kind::fp16, 64, 32, 8, 128, 8192, 16};
    // K/V 64*8192*2*8*128*2 = 2147483648; Q+O 2*64*32*128*2 = 1048576;
    // lengths 64*4 = 256; page table 64*(8192/16)*4 = 131072.
    CHECK(decode_kv_bytes(s) == 2147483648ull);
    CHECK(decode_bytes(s) == 2148663552ull);
}

TEST_CASE("decode bytes: contiguous fp8 MQA 32/1 d128 carries its scales and half queries") {
    const attention_shape s{layout_kind::contiguous, element_kind::fp8_e4m3, 1, 32, 1, 128, 1024, 16};
    // K/V 1*1024*2*1*128*1 = 262144; scales 8; Q+O 2*32*128*2 = 16384; length 4.
    CHECK(decode_bytes(s) == 278540ull);
}

TEST_CASE("decode bytes: paged int8 GQA 32/8 d128 counts each row's scale and half queries") {
    const attention_shape s{layout_kind::paged, element_kind::int8, 1, 32, 8, 128, 16384, 16};
    // K/V 1*16384*2*8*(128 + 4) = 34603008 (fp16: 1*16384*2*8*128*2 = 67108864, 1.94x);
    // Q+O 2*32*128*2 = 16384; length 4; page table (16384/16)*4 = 4096.
    CHECK(decode_kv_bytes(s) == 34603008ull);
    CHECK(decode_bytes(s) == 34623492ull);
}

TEST_CASE("decode bytes: paged int4 GQA 32/8 d128 counts each group's record and half queries") {
    const attention_shape s{layout_kind::paged, element_kind::int4, 1, 32, 8, 128, 16384, 16};
    // K/V 1*16384*2*8*(64 + 4*4) = 20971520 (fp16's 67108864 / 3.2);
    // Q+O 2*32*128*2 = 16384; length 4; page table (16384/16)*4 = 4096.
    CHECK(decode_kv_bytes(s) == 20971520ull);
    CHECK(decode_bytes(s) == 20992004ull);
}

TEST_CASE("append bytes: int8 rows read as half, written with their scales") {
    const attention_shape s{layout_kind::contiguous, element_kind::int8, 1, 8, 8, 128, 0, 16};
    // 1 sequence * 10 tokens * 2 (K, V) * 8 heads * (128*2 read + 128 + 4 written) = 62080.
    CHECK(append_bytes(s, 10) == 62080ull);
}

TEST_CASE("decode bytes: sliding-window fp32 MHA 32/32 d64 has no page table") {
    const attention_shape s{layout_kind::sliding_window, element_kind::fp32, 8, 32, 32, 64, 4096, 16};
    // K/V 8*4096*2*32*64*4 = 536870912; Q+O 2*8*32*64*4 = 131072; lengths 32.
    CHECK(decode_bytes(s) == 537002016ull);
}

TEST_CASE("append bytes: K and V read as half, written as fp16") {
    const attention_shape s{layout_kind::paged, element_kind::fp16, 2, 32, 8, 128, 0, 16};
    // 2 sequences * 512 tokens * 2 (K, V) * 8 * 128 elements * (2 read + 2 written).
    CHECK(append_bytes(s, 512) == 8388608ull);
}

TEST_CASE("prefill FLOPs: causal keys counted by a loop over the queries") {
    for (int prefix : {0, 1, 1024, 3000})
        for (int chunk : {1, 7, 512, 4096}) {
            double keys = 0;
            for (int i = 0; i < chunk; ++i) keys += prefix + i + 1;  // query i sees the prefix and itself
            CHECK(causal_keys_seen(prefix, chunk) == keys);
        }
    // 4 * 32 heads * 128 * (512*1024 + 512*513/2) = 10741612544 for one sequence.
    CHECK(prefill_flops(1, 32, 128, 1024, 512) == 10741612544.0);
    CHECK(prefill_flops(3, 32, 128, 1024, 512) == 3 * 10741612544.0);
}

TEST_CASE("a device copy moves each byte twice") { CHECK(copy_bytes_moved(1000) == 2000.0); }
