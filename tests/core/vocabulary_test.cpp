// Errors, element traits, head configurations and host buffers.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "kvcache/core.hpp"

using namespace kvcache;

TEST_CASE("error carries its code and a message naming value and limit") {
    try {
        throw_error(error_code::out_of_range, "position ", 17, " is past length ", 12);
        FAIL("throw_error returned");
    } catch (const error& e) {
        CHECK(e.code() == error_code::out_of_range);
        const std::string message = e.what();
        CHECK(message.find("kvcache: out_of_range") == 0);
        CHECK(message.find("17") != std::string::npos);
        CHECK(message.find("12") != std::string::npos);
    }
    CHECK_NOTHROW(require(true, error_code::invalid_argument, "never"));
    CHECK_THROWS_AS(require(false, error_code::invalid_argument, "always"), error);
}

TEST_CASE("element traits") {
    CHECK(element_traits<float>::kind == element_kind::fp32);
    CHECK(element_traits<half>::kind == element_kind::fp16);
    CHECK(element_size(element_kind::fp16) == sizeof(half));
    CHECK(element_size(element_kind::fp32) == sizeof(float));
    CHECK(to_float(from_float<half>(0.1f)) == doctest::Approx(0.1f).epsilon(1e-3));
    CHECK(to_float(from_float<float>(0.1f)) == 0.1f);
    CHECK(std::string(to_string(element_kind::fp16)) == "fp16");
    static_assert(std::is_trivially_copyable_v<half>);
    static_assert(is_element_v<half> && is_element_v<float> && !is_element_v<double>);
}

TEST_CASE("fp8 element kinds: names, sizes, the scaled conversions") {
    CHECK(element_traits<float8_e4m3>::kind == element_kind::fp8_e4m3);
    CHECK(element_traits<float8_e5m2>::kind == element_kind::fp8_e5m2);
    CHECK(element_size(element_kind::fp8_e4m3) == 1);
    CHECK(element_size(element_kind::fp8_e5m2) == 1);
    CHECK(element_size(element_kind::bf16) == 2);
    CHECK(is_scaled_kind(element_kind::fp8_e5m2));
    CHECK_FALSE(is_scaled_kind(element_kind::bf16));
    CHECK(is_element_kind(4));
    CHECK(is_element_kind(5));  // int8
    CHECK(is_element_kind(6));  // int4
    CHECK_FALSE(is_element_kind(7));
    element_kind kind{};
    REQUIRE(parse_element_kind("fp8", kind));
    CHECK(kind == element_kind::fp8_e4m3);  // the engines' usual fp8 cache
    REQUIRE(parse_element_kind("e5m2", kind));
    CHECK(kind == element_kind::fp8_e5m2);
    CHECK(std::string(to_string(element_kind::fp8_e4m3)) == "fp8_e4m3");
    CHECK_FALSE(parse_element_kind("fp4", kind));
    static_assert(is_element_v<float8_e4m3> && !is_activation_element_v<float8_e4m3> && is_scaled_element_v<float8_e5m2>);
    static_assert(!is_scaled_element_v<half> && is_activation_element_v<bfloat16>);
    // A stored value means float(v) * scale: 3 / 0.25 = 12 is exact in e4m3.
    const float8_e4m3 stored = from_float_scaled<float8_e4m3>(3.0f, 0.25f);
    CHECK(to_float(stored) == 12.0f);
    CHECK(to_float_scaled(stored, 0.25f) == 3.0f);
    // Past the range divided by the scale: saturates at 448, times the scale.
    CHECK(to_float_scaled(from_float_scaled<float8_e4m3>(1000.0f, 2.0f), 2.0f) == 896.0f);
    CHECK(to_float_scaled(from_float_scaled<half>(3.0f, 0.25f), 0.25f) == 3.0f);  // no scale for half
}

TEST_CASE("compile-time head configurations") {
    using llama3 = head_config<32, 8, 128>;
    static_assert(llama3::group_size() == 4);
    using mqa = head_config<8, 1, 64>;
    static_assert(mqa::group_size() == 8);
    using odd_group = head_config<35, 5, 56>;  // group 7, head dim 56
    static_assert(odd_group::group_size() == 7);
    CHECK(shape_of<llama3>() == head_shape{32, 8, 128});
    CHECK(shape_of<odd_group>().to_string() == "35q/5kv/d56");
}

TEST_CASE("runtime head shapes are validated with the bad value named") {
    CHECK_NOTHROW(head_shape{28, 4, 128}.validate());
    auto message_of = [](head_shape shape) {
        try {
            shape.validate();
        } catch (const error& e) {
            CHECK(e.code() == error_code::invalid_argument);
            return std::string(e.what());
        }
        return std::string("no error");
    };
    CHECK(message_of({30, 8, 128}).find("query_heads = 30 is not a multiple of kv_heads = 8") != std::string::npos);
    CHECK(message_of({0, 8, 128}).find("query_heads = 0") != std::string::npos);
    CHECK(message_of({8, 8, 60}).find("head_dim = 60") != std::string::npos);
    CHECK(message_of({8, -1, 64}).find("kv_heads = -1") != std::string::npos);
}

TEST_CASE("host buffers are aligned, zeroed, movable") {
    host_buffer<half> buffer(1000);
    REQUIRE(buffer.size() == 1000);
    CHECK(reinterpret_cast<std::uintptr_t>(buffer.data()) % 64 == 0);
    bool all_zero = true;
    for (std::size_t i = 0; i < buffer.size(); ++i) all_zero = all_zero && buffer[i].bits == 0;
    CHECK(all_zero);
    buffer[3] = half(2.0f);
    host_buffer<half> moved(std::move(buffer));
    CHECK(moved.size() == 1000);
    CHECK(static_cast<float>(moved[3]) == 2.0f);
    CHECK(buffer.size() == 0);  // NOLINT: moved-from state is documented as empty
    CHECK(buffer.data() == nullptr);
    host_buffer<float> empty;
    CHECK(empty.empty());
}

TEST_CASE("a failed allocation throws out_of_memory naming the size") {
    SUBCASE("size overflow") {
        try {
            host_buffer<double> impossible(~std::size_t{0} / 4);
            FAIL("allocation of an impossible size succeeded");
        } catch (const error& e) {
            CHECK(e.code() == error_code::out_of_memory);
            CHECK(std::string(e.what()).find("overflows") != std::string::npos);
        }
    }
    SUBCASE("allocator refuses") {
        const std::size_t count = std::size_t{1} << 50;  // 1 PiB of bytes
        try {
            host_buffer<std::uint8_t> too_big(count);
            FAIL("a 1 PiB allocation succeeded");
        } catch (const error& e) {
            CHECK(e.code() == error_code::out_of_memory);
            CHECK(std::string(e.what()).find(std::to_string(count)) != std::string::npos);
        }
    }
}

TEST_CASE("host memory policy copies") {
    float source[4] = {1, 2, 3, 4};
    float target[4] = {};
    host_memory::copy_from_host(target, source, sizeof source);
    CHECK(std::memcmp(source, target, sizeof source) == 0);
    static_assert(host_memory::space == memory_space::host);
}
