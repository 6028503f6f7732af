// The safetensors reader and config parser on good and bad input: every bad
// case is one kvcache::error naming the file (and tensor), never a bad read.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint_writer.hpp"
#include "kvcache_engine/checkpoint_loader.hpp"
#include "support/scratch_dir.hpp"
#include "test_paths.hpp"

using namespace kvcache::examples;
using namespace kvcache::examples::testing;
using kvcache::error_code;

namespace {

std::vector<tensor_to_write> sample_tensors() {
    return {{"a", "F32", {2, 3}, {1, 2, 3, 4, 5, 6}},
            {"b", "F16", {4}, {0.5f, -1.0f, 65504.0f, 0.0f}},
            {"c", "BF16", {1, 2}, {3.0f, -0.125f}}};
}

// Runs the parser on bytes and returns the error message ("" when it parsed).
std::string parse_error(const std::vector<unsigned char>& bytes) {
    try {
        parse_safetensors_header(bytes.data(), bytes.size(), "x.safetensors");
    } catch (const kvcache::error& e) {
        CHECK(e.code() == error_code::format_error);
        return e.what();
    }
    return "";
}

std::vector<unsigned char> with_header(const std::string& header, std::size_t data_bytes) {
    std::vector<unsigned char> out;
    put_le(out, header.size(), 8);
    out.insert(out.end(), header.begin(), header.end());
    out.resize(out.size() + data_bytes, 0);
    return out;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string temp_dir(const std::string& name) {
    const std::string dir = scratch_dir("kvcache_model_test", name);
    std::filesystem::create_directories(dir);
    return dir;
}

}  // namespace

TEST_CASE("a well-formed file parses and converts F32, F16 and BF16 to float") {
    std::string dir = temp_dir("good");
    write_bytes(dir + "/t.safetensors", safetensors_bytes(sample_tensors()));
    safetensors_file f(dir + "/t.safetensors");
    CHECK(f.header().tensors.size() == 3);
    CHECK(f.read_floats("a", {2, 3}) == std::vector<float>{1, 2, 3, 4, 5, 6});
    CHECK(f.read_floats("b", {4}) == std::vector<float>{0.5f, -1.0f, 65504.0f, 0.0f});
    CHECK(f.read_floats("c", {1, 2}) == std::vector<float>{3.0f, -0.125f});
}

TEST_CASE("each kind of corrupt header is one clear format error") {
    auto good = safetensors_bytes(sample_tensors());
    CHECK(parse_error(good).empty());

    SUBCASE("shorter than the length field") {
        CHECK(contains(parse_error({1, 2, 3}), "too short"));
    }
    SUBCASE("header length past the end of the file") {
        auto bytes = good;
        bytes.resize(20);
        CHECK(contains(parse_error(bytes), "truncated"));
    }
    SUBCASE("absurd header length") {
        auto bytes = good;
        for (int i = 0; i < 8; ++i) bytes[i] = 0xFF;
        CHECK(contains(parse_error(bytes), "exceeds the limit"));
    }
    SUBCASE("not JSON") {
        CHECK(contains(parse_error(with_header("{\"a\": [1,", 0)), "not valid JSON"));
    }
    SUBCASE("tensor data cut off: offsets run past the file") {
        auto bytes = good;
        bytes.resize(bytes.size() - 1);
        std::string message = parse_error(bytes);
        CHECK(contains(message, "x.safetensors"));
        CHECK(contains(message, "tensor 'c'"));
        CHECK(contains(message, "run past the data section"));
    }
    SUBCASE("offsets beyond a small file") {
        auto message = parse_error(with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8000000000]}})", 8));
        CHECK(contains(message, "tensor 'w'"));
        CHECK(contains(message, "run past"));
    }
    SUBCASE("begin after end") {
        CHECK(contains(parse_error(with_header(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8)),
                       "begin after end"));
    }
    SUBCASE("dtype and shape disagree with the byte span") {
        auto message = parse_error(with_header(R"({"w":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}})", 8));
        CHECK(contains(message, "tensor 'w'"));
        CHECK(contains(message, "need 6"));
    }
    SUBCASE("unknown dtype") {
        CHECK(contains(parse_error(with_header(R"({"w":{"dtype":"F42","shape":[1],"data_offsets":[0,4]}})", 4)),
                       "unknown dtype"));
    }
    SUBCASE("negative or fractional shape, overflowing element count") {
        CHECK(contains(parse_error(with_header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)),
                       "shape"));
        CHECK(contains(parse_error(with_header(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4)),
                       "shape"));
        CHECK(contains(parse_error(with_header(
                           R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", 4)),
                       "more elements"));
    }
    SUBCASE("missing fields and wrong types") {
        CHECK(contains(parse_error(with_header(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4)), "dtype"));
        CHECK(contains(parse_error(with_header(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4)), "shape"));
        CHECK(contains(parse_error(with_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4)),
                       "data_offsets"));
        CHECK(contains(parse_error(with_header(R"({"w":7})", 0)), "not an object"));
        CHECK(contains(parse_error(with_header(R"([1,2])", 0)), "not a JSON object"));
    }
}

TEST_CASE("fuzz: mutated and truncated headers either parse into in-bounds tensors or throw format_error") {
    const auto good = safetensors_bytes(sample_tensors());
    seeded_random random(2024);
    int parsed = 0, refused = 0;
    auto run = [&](const std::vector<unsigned char>& bytes) {
        try {
            auto header = parse_safetensors_header(bytes.data(), bytes.size(), "fuzz.safetensors");
            ++parsed;
            // Whatever parsed must lie inside the buffer, checked here without the parser's help.
            for (const auto& [name, e] : header.tensors) {
                CHECK(e.begin <= e.end);
                CHECK(header.data_start + e.end <= bytes.size());
            }
        } catch (const kvcache::error& e) {
            ++refused;
            CHECK(e.code() == error_code::format_error);
        }
    };
    // Every truncation.
    for (std::size_t n = 0; n < good.size(); ++n) run(std::vector<unsigned char>(good.begin(), good.begin() + n));
    // Random byte changes, insertions of JSON-significant characters and deletions in the header.
    const char significant[] = "{}[]\",:0123456789-eE.FBtfn \\";
    for (int i = 0; i < 20000; ++i) {
        auto bytes = good;
        int edits = 1 + static_cast<int>(random.next() % 4);
        for (int e = 0; e < edits; ++e) {
            std::size_t at = random.next() % bytes.size();
            switch (random.next() % 4) {
            case 0: bytes[at] = static_cast<unsigned char>(random.next()); break;
            case 1: bytes[at] = static_cast<unsigned char>(significant[random.next() % (sizeof significant - 1)]); break;
            case 2: bytes.insert(bytes.begin() + static_cast<long>(at), significant[random.next() % (sizeof significant - 1)]); break;
            default: bytes.erase(bytes.begin() + static_cast<long>(at)); break;
            }
            if (bytes.empty()) break;
        }
        if (random.next() % 8 == 0 && bytes.size() > 1) bytes.resize(random.next() % bytes.size());
        run(bytes);
    }
    CHECK(parsed > 0);
    CHECK(refused > 1000);
}

TEST_CASE("reading a tensor checks the shape the config needs and names file and tensor") {
    std::string dir = temp_dir("shape");
    write_bytes(dir + "/t.safetensors", safetensors_bytes(sample_tensors()));
    safetensors_file f(dir + "/t.safetensors");
    try {
        f.read_floats("a", {3, 2});
        FAIL("a wrong shape was accepted");
    } catch (const kvcache::error& e) {
        std::string m = e.what();
        CHECK(contains(m, "t.safetensors"));
        CHECK(contains(m, "tensor 'a'"));
        CHECK(contains(m, "[2, 3]"));
        CHECK(contains(m, "[3, 2]"));
    }
    CHECK_THROWS_WITH_AS(f.read_floats("zz", {1}), doctest::Contains("tensor 'zz' is missing"), kvcache::error);
    CHECK_THROWS_WITH_AS(safetensors_file(dir + "/missing.safetensors"), doctest::Contains("missing.safetensors: cannot open"),
                         kvcache::error);
    write_bytes(dir + "/empty.safetensors", {});
    CHECK_THROWS_WITH_AS(safetensors_file(dir + "/empty.safetensors"), doctest::Contains("too short"), kvcache::error);
}

TEST_CASE("config.json: defaults, and refusals that name the field") {
    auto parse = [](const std::string& text) { return parse_model_config(nlohmann::json::parse(text), "config.json"); };
    const std::string base = R"("vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                "intermediate_size": 128)";
    auto c = parse("{\"model_type\": \"llama\", " + base + "}");
    CHECK(c.model.num_kv_heads == 4);
    CHECK(c.model.head_dim == 16);
    CHECK(!c.model.attention_bias);
    CHECK(c.model.rope_theta == 10000.0);
    CHECK(parse("{\"model_type\": \"qwen2\", " + base + "}").model.attention_bias);
    CHECK(parse("{\"model_type\": \"mistral\", \"sliding_window\": 4096, " + base + "}").sliding_window == 4096);
    auto l3 = parse("{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, "
                    "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}, " +
                    base + "}");
    CHECK(l3.model.scaling.type == rope_scaling::kind::llama3);
    CHECK(l3.model.scaling.factor == 32.0);

    CHECK_THROWS_WITH_AS(parse("{\"model_type\": \"gpt2\", " + base + "}"), doctest::Contains("model_type = 'gpt2'"),
                         kvcache::error);
    CHECK_THROWS_WITH_AS(parse("{\"model_type\": \"llama\", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}, " + base + "}"),
                         doctest::Contains("rope_scaling.rope_type = 'yarn'"), kvcache::error);
    CHECK_THROWS_WITH_AS(parse("{\"model_type\": \"llama\", \"hidden_act\": \"gelu\", " + base + "}"),
                         doctest::Contains("hidden_act"), kvcache::error);
    CHECK_THROWS_WITH_AS(parse(R"({"model_type": "llama", "hidden_size": 64})"), doctest::Contains("'vocab_size' is missing"),
                         kvcache::error);
    CHECK_THROWS_WITH_AS(parse("{\"model_type\": \"llama\", \"num_key_value_heads\": 3, " + base + "}"),
                         doctest::Contains("num_key_value_heads"), kvcache::error);
    CHECK_THROWS_WITH_AS(parse("{\"model_type\": \"llama\", \"rms_norm_eps\": \"small\", " + base + "}"),
                         doctest::Contains("rms_norm_eps"), kvcache::error);
    CHECK_THROWS_WITH_AS(read_model_config(temp_dir("noconfig")), doctest::Contains("config.json: cannot open"),
                         kvcache::error);
}

TEST_CASE("config.json: products of fields that overflow int, or that no buffer could hold, are refused") {
    auto parse = [](const std::string& text) { return parse_model_config(nlohmann::json::parse(text), "config.json"); };
    // Each field alone is within the parser's per-field bound of 2^30; only the products are hostile.
    auto config = [](int vocab, int hidden, int layers, int heads, int kv_heads, int head_dim, int ffn) {
        return "{\"model_type\": \"llama\", \"vocab_size\": " + std::to_string(vocab) + ", \"hidden_size\": " +
               std::to_string(hidden) + ", \"num_hidden_layers\": " + std::to_string(layers) +
               ", \"num_attention_heads\": " + std::to_string(heads) + ", \"num_key_value_heads\": " +
               std::to_string(kv_heads) + ", \"head_dim\": " + std::to_string(head_dim) +
               ", \"intermediate_size\": " + std::to_string(ffn) + "}";
    };
    // 65536 * 65536 = 2^32 wraps a 32-bit int to 0.
    CHECK_THROWS_WITH_AS(parse(config(100, 64, 2, 65536, 65536, 65536, 128)),
                         doctest::Contains("num_attention_heads * head_dim = 65536 * 65536 = 4294967296"), kvcache::error);
    CHECK_THROWS_WITH_AS(parse(config(100, 64, 2, 4096, 1, 8192, 128)),
                         doctest::Contains("num_attention_heads * head_dim = 4096 * 8192 = 33554432 exceeds the limit 16777216"),
                         kvcache::error);
    // 2^30 * 2^30 = 2^60 elements of embedding.
    CHECK_THROWS_WITH_AS(parse(config(1 << 30, 1 << 30, 2, 4, 4, 16, 128)),
                         doctest::Contains("vocab_size * hidden_size = 1073741824 * 1073741824 = 1152921504606846976"),
                         kvcache::error);
    CHECK_THROWS_WITH_AS(parse(config(100, 1 << 20, 2, 4, 4, 16, 1 << 20)),
                         doctest::Contains("intermediate_size * hidden_size = 1048576 * 1048576"), kvcache::error);
    CHECK_THROWS_WITH_AS(parse(config(100, 1 << 16, 2, 1 << 14, 1 << 14, 1 << 10, 128)),
                         doctest::Contains("num_attention_heads * head_dim * hidden_size"), kvcache::error);
    // Every tensor fits on its own; 2^30 layers of them do not.
    CHECK_THROWS_WITH_AS(parse(config(100, 4096, 1 << 30, 32, 8, 128, 14336)), doctest::Contains("num_hidden_layers = 1073741824"),
                         kvcache::error);
    bool refused = false;
    try {
        parse(config(100, 4096, 1 << 30, 32, 8, 128, 14336));
    } catch (const kvcache::error& e) {
        refused = true;
        CHECK(e.code() == kvcache::error_code::format_error);
        CHECK(std::string(e.what()).find("1099511627776") != std::string::npos);  // the stated limit, 2^40
    }
    CHECK(refused);
    // A real large shape (Llama-3-70B) passes.
    auto big = parse(config(128256, 8192, 80, 64, 8, 128, 28672));
    CHECK(big.model.q_width() == 8192);
}

namespace {

// A config.json of engine/tests/configs, written by transformers 5.24 (LlamaConfig(...).save_pretrained).
checkpoint_config read_fixture(const std::string& name) {
    const std::string configs = kvcache_test::directory_from_environment("KVCACHE_MODEL_TEST_CONFIGS");
    return parse_model_config(nlohmann::json::parse(std::ifstream(configs + "/" + name)),
                              name);
}

}  // namespace

TEST_CASE("config.json as transformers 5 writes it: rope_parameters, no top-level rope_theta or rope_scaling") {
    auto llama3 = read_fixture("llama3_transformers5.json");
    CHECK(llama3.model.rope_theta == 500000.0);
    CHECK(llama3.model.scaling.type == rope_scaling::kind::llama3);
    CHECK(llama3.model.scaling.factor == 8.0);
    CHECK(llama3.model.scaling.low_freq_factor == 1.0);
    CHECK(llama3.model.scaling.high_freq_factor == 4.0);
    CHECK(llama3.model.scaling.original_max_position_embeddings == 8192);
    auto mistral = read_fixture("mistral_transformers5.json");
    CHECK(mistral.model.rope_theta == 1000000.0);
    CHECK(mistral.model.scaling.type == rope_scaling::kind::none);
    auto qwen2 = read_fixture("qwen2_sliding_transformers5.json");
    CHECK(qwen2.model.rope_theta == 1000000.0);
    CHECK(qwen2.model.scaling.type == rope_scaling::kind::none);
}

TEST_CASE("config.json: rope_theta/rope_scaling and rope_parameters together must agree") {
    auto parse = [](const std::string& fields) {
        return parse_model_config(nlohmann::json::parse(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, )" + fields + "}"),
                                  "config.json");
    };
    const std::string llama3 = R"("rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192)";
    SUBCASE("both forms, the same values: accepted") {
        auto c = parse(R"("rope_theta": 500000.0, "rope_scaling": {)" + llama3 + R"(}, "rope_parameters": {"rope_theta": 500000.0, )" +
                       llama3 + "}");
        CHECK(c.model.rope_theta == 500000.0);
        CHECK(c.model.scaling.type == rope_scaling::kind::llama3);
        CHECK(c.model.scaling.factor == 8.0);
    }
    SUBCASE("theta differs") {
        CHECK_THROWS_WITH_AS(parse(R"("rope_theta": 10000.0, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"})"),
                             doctest::Contains("rope_theta = 10000 disagrees with rope_parameters.rope_theta = 500000"),
                             kvcache::error);
    }
    SUBCASE("type differs") {
        CHECK_THROWS_WITH_AS(parse(R"("rope_scaling": {"rope_type": "linear", "factor": 2.0},
                                      "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"})"),
                             doctest::Contains("rope_scaling.rope_type = 'linear' disagrees with rope_parameters.rope_type = 'default'"),
                             kvcache::error);
    }
    SUBCASE("a scaling field differs") {
        CHECK_THROWS_WITH_AS(parse(R"("rope_scaling": {)" + llama3 + R"(}, "rope_parameters": {"rope_theta": 10000.0, )" +
                                   llama3.substr(0, llama3.find("8192")) + "32768}"),
                             doctest::Contains("rope_scaling.original_max_position_embeddings = 8192 disagrees with "
                                               "rope_parameters.original_max_position_embeddings = 32768"),
                             kvcache::error);
    }
    SUBCASE("the error is a format error") {
        bool refused = false;
        try {
            parse(R"("rope_theta": 1.0, "rope_parameters": {"rope_theta": 2.0})");
        } catch (const kvcache::error& e) {
            refused = true;
            CHECK(e.code() == kvcache::error_code::format_error);
        }
        CHECK(refused);
    }
    SUBCASE("keyed by layer type: entries that agree are read, entries that differ refused") {
        auto c = parse(R"("rope_parameters": {
                          "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                          "sliding_attention": {"rope_theta": 1000000.0, "rope_type": "default"}})");
        CHECK(c.model.rope_theta == 1000000.0);
        CHECK_THROWS_WITH_AS(parse(R"("rope_parameters": {
                                      "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                                      "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}})"),
                             doctest::Contains("rope_parameters.full_attention.rope_theta = 1000000 disagrees with "
                                               "rope_parameters.sliding_attention.rope_theta = 10000"),
                             kvcache::error);
    }
    SUBCASE("an unsupported type in rope_parameters") {
        CHECK_THROWS_WITH_AS(parse(R"("rope_parameters": {"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0})"),
                             doctest::Contains("rope_parameters.rope_type = 'yarn' is not supported"), kvcache::error);
    }
}

TEST_CASE("config.json: layer_types must name every layer, as full_attention or sliding_attention") {
    auto parse = [](const std::string& fields) {
        return parse_model_config(nlohmann::json::parse(R"({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 64,
            "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 128, )" + fields + "}"),
                                  "config.json");
    };
    CHECK_THROWS_WITH_AS(parse(R"("layer_types": ["full_attention", "full_attention"])"),
                         doctest::Contains("layer_types has 2 entries but num_hidden_layers = 3"), kvcache::error);
    CHECK_THROWS_WITH_AS(parse(R"("layer_types": ["full_attention", "chunked_attention", "full_attention"])"),
                         doctest::Contains("layer_types[1] = \"chunked_attention\""), kvcache::error);
    CHECK_THROWS_WITH_AS(parse(R"("layer_types": "full_attention")"), doctest::Contains("layer_types"), kvcache::error);
    CHECK(parse(R"("layer_types": ["full_attention", "full_attention", "full_attention"])").model.num_layers == 3);
}

TEST_CASE("config.json: which layers attend through a sliding window") {
    auto parse = [](const std::string& type, const std::string& fields) {
        return parse_model_config(nlohmann::json::parse(R"({"model_type": ")" + type + R"(", "vocab_size": 100,
            "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 128, )" + fields + "}"),
                                  "config.json");
    };
    using windows = std::vector<int>;
    SUBCASE("transformers 5's Qwen2 fixture: layer_types windows layers 20..27 of 28") {
        auto q = read_fixture("qwen2_sliding_transformers5.json");
        windows expected(28, 0);
        for (int l = 20; l < 28; ++l) expected[l] = 4096;
        CHECK(q.model.layer_window == expected);
        CHECK(q.sliding_window == 4096);
        CHECK(read_fixture("mistral_transformers5.json").model.layer_window == windows(32, 4096));
        CHECK(read_fixture("llama3_transformers5.json").model.layer_window.empty());
    }
    SUBCASE("Qwen2 without layer_types: the layers from max_window_layers on") {
        CHECK(parse("qwen2", R"("use_sliding_window": true, "sliding_window": 16, "max_window_layers": 1)").model.layer_window ==
              windows{0, 16, 16, 16});
        CHECK(parse("qwen2", R"("use_sliding_window": true, "sliding_window": 16, "max_window_layers": 28)").model.layer_window.empty());
        // Qwen2.5's own configs: a window stated but switched off.
        auto off = parse("qwen2", R"("use_sliding_window": false, "sliding_window": 131072, "max_window_layers": 2)");
        CHECK(off.model.layer_window.empty());
        CHECK(off.sliding_window == 0);
    }
    SUBCASE("Qwen2 with layer_types: it decides, over max_window_layers") {
        auto c = parse("qwen2", R"("use_sliding_window": true, "sliding_window": 8, "max_window_layers": 0,
            "layer_types": ["sliding_attention", "full_attention", "full_attention", "sliding_attention"])");
        CHECK(c.model.layer_window == windows{8, 0, 0, 8});
        CHECK_THROWS_WITH_AS(parse("qwen2", R"("use_sliding_window": false, "sliding_window": 8,
            "layer_types": ["full_attention", "sliding_attention", "full_attention", "full_attention"])"),
                             doctest::Contains("layer_types[1] = \"sliding_attention\" but use_sliding_window is false"),
                             kvcache::error);
    }
    SUBCASE("Mistral windows every layer; a layer_types saying otherwise is refused") {
        CHECK(parse("mistral", R"("sliding_window": 4096)").model.layer_window == windows(4, 4096));
        CHECK(parse("mistral", R"("sliding_window": null)").model.layer_window.empty());
        CHECK_THROWS_WITH_AS(parse("mistral", R"("sliding_window": 4096,
            "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"])"),
                             doctest::Contains("layer_types[0] = \"full_attention\" but model_type mistral windows every layer"),
                             kvcache::error);
    }
    SUBCASE("Llama has no windowed layers") {
        CHECK(parse("llama", R"("sliding_window": 4096)").model.layer_window.empty());
        CHECK_THROWS_WITH_AS(parse("llama", R"("layer_types": ["full_attention", "sliding_attention", "full_attention",
            "full_attention"])"), doctest::Contains("layer_types[1] = \"sliding_attention\" is not supported for model_type llama"),
                             kvcache::error);
    }
}
