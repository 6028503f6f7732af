// The examples' command-line parsing: every malformed value is a usage_error
// naming the option, never a silent default or a crash.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kvcache_engine/arguments.hpp"

using kvcache::examples::arguments;
using kvcache::examples::usage_error;

namespace {

arguments parse(std::vector<std::string> words) {
    std::vector<char*> argv{const_cast<char*>("prog")};
    for (auto& w : words) argv.push_back(w.data());
    return arguments(static_cast<int>(argv.size()), argv.data(), {"--flag"}, {"--n", "--list", "--layout", "--dtype"});
}

}  // namespace

TEST_CASE("well-formed options parse, absent ones fall back") {
    auto a = parse({"--flag", "--n", "12", "--list", "3,40,500", "--layout", "sliding_window", "--dtype", "fp16"});
    CHECK(a.has("--flag"));
    CHECK(a.integer("--n", 0, 1, 100) == 12);
    CHECK(a.integers("--list", {}, 1, 1000) == std::vector<int>{3, 40, 500});
    CHECK(a.layout("--layout", kvcache::layout_kind::paged) == kvcache::layout_kind::sliding_window);
    CHECK(a.element("--dtype", kvcache::element_kind::fp32) == kvcache::element_kind::fp16);
    auto empty = parse({});
    CHECK(!empty.has("--flag"));
    CHECK(empty.integer("--n", 7, 1, 100) == 7);
    CHECK(empty.layout("--layout", kvcache::layout_kind::paged) == kvcache::layout_kind::paged);
}

TEST_CASE("malformed command lines are usage errors naming the option") {
    CHECK_THROWS_WITH_AS(parse({"--bogus"}), doctest::Contains("unknown argument '--bogus'"), usage_error);
    CHECK_THROWS_WITH_AS(parse({"--n"}), doctest::Contains("--n needs a value"), usage_error);
    CHECK_THROWS_WITH_AS(parse({"--n", "12x"}).integer("--n", 0, 0, 100), doctest::Contains("'12x' is not an integer"),
                         usage_error);
    CHECK_THROWS_WITH_AS(parse({"--n", ""}).integer("--n", 0, 0, 100), doctest::Contains("is not an integer"), usage_error);
    CHECK_THROWS_WITH_AS(parse({"--n", "99999999999999999999"}).integer("--n", 0, 0, 100),
                         doctest::Contains("is not an integer"), usage_error);
    CHECK_THROWS_WITH_AS(parse({"--n", "101"}).integer("--n", 0, 0, 100), doctest::Contains("outside [0, 100]"), usage_error);
    CHECK_THROWS_WITH_AS(parse({"--n", "-1"}).integer("--n", 0, 0, 100), doctest::Contains("outside [0, 100]"), usage_error);
    CHECK_THROWS_WITH_AS(parse({"--list", "1,,2"}).integers("--list", {}, 0, 9), doctest::Contains("'' is not an integer"),
                         usage_error);
    CHECK_THROWS_WITH_AS(parse({"--list", "1,2,"}).integers("--list", {}, 0, 9), doctest::Contains("is not an integer"),
                         usage_error);
    CHECK_THROWS_WITH_AS(parse({"--layout", "ring"}).layout("--layout", kvcache::layout_kind::paged),
                         doctest::Contains("'ring' is not one of"), usage_error);
    CHECK(parse({"--dtype", "bf16"}).element("--dtype", kvcache::element_kind::fp32) == kvcache::element_kind::bf16);
    CHECK_THROWS_WITH_AS(parse({"--dtype", "fp12"}).element("--dtype", kvcache::element_kind::fp32),
                         doctest::Contains("'fp12' is not one of fp32, fp16, bf16"), usage_error);
}
