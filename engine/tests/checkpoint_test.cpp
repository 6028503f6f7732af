// A tiny checkpoint written by the test in safetensors format, loaded back:
// weights equal what was written (through F32, F16 and BF16), single file and
// sharded, tied and separate output, Qwen2 biases; cached generation through
// kvcache gives the ids of recomputation; every bad input names file and tensor.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint_writer.hpp"
#include "kvcache_engine/checkpoint_loader.hpp"
#include "naive_cache_attention.hpp"
#include "support/cached_generation.hpp"
#include "support/scratch_dir.hpp"
#include "kvcache_engine/device_attention.hpp"
#include "kvcache_engine/kvcache_attention.hpp"

using namespace kvcache::examples;
using namespace kvcache::examples::testing;

namespace {

std::string fresh_dir(const std::string& name) { return scratch_dir("kvcache_checkpoint_test", name); }

// Every tensor of `loaded` equals the written one after rounding through its dtype.
void check_weights_equal(const model_weights& written, const model_weights& loaded, const std::vector<std::string>& dtypes) {
    auto expected = checkpoint_tensors(written, dtypes);
    auto got = checkpoint_tensors(loaded, {"F32"});
    REQUIRE(expected.size() == got.size());
    for (std::size_t t = 0; t < expected.size(); ++t) {
        CAPTURE(expected[t].name);
        REQUIRE(got[t].name == expected[t].name);
        REQUIRE(got[t].values.size() == expected[t].values.size());
        std::size_t mismatches = 0;
        for (std::size_t i = 0; i < got[t].values.size(); ++i)
            mismatches += got[t].values[i] != stored_value(expected[t].dtype, expected[t].values[i]);
        CHECK(mismatches == 0);
    }
}

std::string load_error(const std::string& dir) {
    try {
        load_checkpoint(dir, read_model_config(dir));
    } catch (const kvcache::error& e) {
        return e.what();
    }
    return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a written checkpoint loads back bit for bit, in one file or sharded") {
    for (const char* type : {"llama", "qwen2", "llama_bias"})
        for (bool tied : {false, true})
            for (int shards : {1, 3}) {
                CAPTURE(type);
                CAPTURE(tied);
                CAPTURE(shards);
                model_config c = tiny_config(type);
                c.tie_word_embeddings = tied;
                auto weights = make_random_weights(c, 7);
                std::vector<std::string> dtypes{"F32", "BF16", "F16"};
                std::string dir = fresh_dir(std::string(type) + (tied ? "_tied_" : "_") + std::to_string(shards));
                write_checkpoint(dir, weights, dtypes, shards);
                auto config = read_model_config(dir);
                CHECK(config.model.heads() == c.heads());
                CHECK(config.model.attention_bias == (std::string(type) != "llama"));
                CHECK(config.model.output_bias == (std::string(type) == "llama_bias"));
                CHECK(config.model.tie_word_embeddings == tied);
                auto loaded = load_checkpoint(dir, config);
                CHECK(loaded.lm_head.empty() == tied);
                check_weights_equal(weights, loaded, dtypes);
            }
}

TEST_CASE("the loaded checkpoint generates the same ids cached (every layout and element type) and recomputed") {
    thread_pool pool(2);
    std::string dir = fresh_dir("generate");
    write_checkpoint(dir, make_random_weights(tiny_config("qwen2"), 9), {"BF16"});
    auto config = read_model_config(dir);
    llama_model model(load_checkpoint(dir, config), pool);
    std::vector<int> prompt{1, 5, 9, 200, 17, 3, 3, 44};
    for_each_cache_kind(4, 8, 2, 4, [&](const cache_options& cache) {
        recompute_attention recompute(config.model, pool, cache.element, cache.visibility());
        auto slow = generate(model, prompt, 16, recompute, generation_mode::recompute);
        auto fast = generate_with_kvcache<configurations_for<kvcache::head_config<4, 2, 16>>>(model, prompt, 16, cache).trace;
        CHECK(slow.tokens == fast.tokens);
    });
}

TEST_CASE("a config in transformers 5's form (rope_parameters) runs the model its transformers 4 form describes") {
    thread_pool pool(2);
    model_config c = tiny_config("llama");
    c.rope_theta = 500000.0;
    auto weights = make_random_weights(c, 21);
    // original_max_position_embeddings 16 puts the head's frequencies in all three llama3 bands.
    const std::string scaling = R"("rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 16)";
    std::string v4 = fresh_dir("rope_v4"), v5 = fresh_dir("rope_v5"), plain = fresh_dir("rope_plain");
    write_checkpoint(v4, weights, {"F32"}, 1, "\"rope_scaling\": {" + scaling + "},\n  ");
    write_checkpoint(v5, weights, {"F32"}, 1, "", scaling);
    model_config unscaled = c;
    unscaled.rope_theta = 10000.0;
    model_weights unscaled_weights = weights;
    unscaled_weights.config = unscaled;
    write_checkpoint(plain, unscaled_weights, {"F32"});
    std::vector<int> prompt{1, 5, 9, 200, 17, 3, 3, 44, 9, 12, 80, 7, 7, 101, 2, 19};
    generation_options keep;
    keep.keep_logits = true;
    auto run = [&](const std::string& dir) {
        llama_model model(load_checkpoint(dir, read_model_config(dir)), pool);
        recompute_attention recompute(model.config(), pool, kvcache::element_kind::fp32);
        return generate(model, prompt, 6, recompute, generation_mode::recompute, keep);
    };
    auto old_form = run(v4), new_form = run(v5), default_rope = run(plain);
    CHECK(new_form.tokens == old_form.tokens);
    CHECK(largest_logit_difference(new_form, old_form) == 0.0);
    // The scaling and theta change the logits at this length, so reading them matters.
    CHECK(largest_logit_difference(default_rope, old_form) > 1e-3);
}

TEST_CASE("Qwen2 windowing some layers: cached (every layout) equals recomputed, and both the naive per-layer windows") {
    using heads = kvcache::head_config<4, 2, 16>;
    thread_pool pool(2);
    model_config c = tiny_config("qwen2");
    c.num_layers = 3;
    std::string dir = fresh_dir("qwen2_mixed");
    // layer_types decides over max_window_layers (which alone would window layers 1 and 2).
    write_checkpoint(dir, make_random_weights(c, 13), {"F32"}, 1,
                     "\"use_sliding_window\": true,\n  \"sliding_window\": 4,\n  \"max_window_layers\": 1,\n  "
                     "\"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\"],\n  ");
    auto config = read_model_config(dir);
    CHECK(config.sliding_window == 4);
    llama_model model(load_checkpoint(dir, config), pool);
    std::vector<int> prompt{1, 5, 9, 200, 17, 3, 3, 44};
    generation_options keep;
    keep.keep_logits = true;
    // Plain vectors, double precision, windows given here: no kvcache and no config parsing.
    testing::naive_cache_attention naive(model.config(), {4, 0, 4});
    auto expected = generate(model, prompt, 12, naive, generation_mode::cached, keep);
    testing::naive_cache_attention unwindowed(model.config());
    auto full = generate(model, prompt, 12, unwindowed, generation_mode::cached, keep);
    REQUIRE(largest_logit_difference(full, expected) > 1e-2);  // the windows matter at this length
    recompute_attention plain(model.config(), pool, kvcache::element_kind::fp32);
    auto recomputed = generate(model, prompt, 12, plain, generation_mode::recompute, keep);
    CHECK(recomputed.tokens == expected.tokens);
    CHECK(largest_logit_difference(recomputed, expected) < 1e-4);
    for_each_cache_kind(4, 8, 2, 4, [&](const cache_options& cache) {
        recompute_attention recompute(model.config(), pool, cache.element, cache.visibility());
        auto slow = generate(model, prompt, 12, recompute, generation_mode::recompute, keep);
        auto fast = generate_with_kvcache<configurations_for<kvcache::head_config<4, 2, 16>>>(model, prompt, 12, cache, keep).trace;
        CHECK(slow.tokens == fast.tokens);
        CHECK(largest_logit_difference(fast, slow) < 1e-3);
        if (cache.element == kvcache::element_kind::fp32 && cache.layout != kvcache::layout_kind::sliding_window) {
            CHECK(fast.tokens == expected.tokens);
            CHECK(largest_logit_difference(fast, expected) < 1e-4);
        }
    });
    // The GPU path's steps (device_attention, one per owner) on the SIMT emulator.
    cache_options paged;
    auto emulated = generate_with_kvcache_emulated<heads>(model, prompt, 12, paged, keep).trace;
    CHECK(emulated.tokens == expected.tokens);
    CHECK(largest_logit_difference(emulated, expected) < 1e-4);
}

TEST_CASE("bad checkpoints: one error naming the file and the tensor") {
    model_config c = tiny_config();
    auto weights = make_random_weights(c, 3);
    std::string dir = fresh_dir("bad");
    write_checkpoint(dir, weights, {"F32"});
    const std::string file = dir + "/model.safetensors";

    SUBCASE("missing folder and missing config") {
        CHECK(contains(load_error(dir + "/nothing"), "config.json: cannot open"));
    }
    SUBCASE("a shape that does not match the config") {
        model_config other = c;
        other.intermediate_size = 96;
        write_text(dir + "/config.json", config_json(other));
        auto m = load_error(dir);
        CHECK(contains(m, "model.safetensors"));
        CHECK(contains(m, "tensor 'model.layers.0.mlp.gate_proj.weight'"));
        CHECK(contains(m, "[128, 64]"));
    }
    SUBCASE("an unsupported dtype") {
        auto tensors = checkpoint_tensors(weights, {"F32"});
        auto bytes = safetensors_bytes(tensors);
        // Relabel the embedding as I32 (same element size): the header stays consistent.
        std::string text(bytes.begin(), bytes.end());
        text.replace(text.find("\"F32\""), 5, "\"I32\"");
        write_bytes(file, std::vector<unsigned char>(text.begin(), text.end()));
        auto m = load_error(dir);
        CHECK(contains(m, "tensor 'model.embed_tokens.weight' has dtype I32"));
    }
    SUBCASE("a missing tensor") {
        auto tensors = checkpoint_tensors(weights, {"F32"});
        tensors.erase(tensors.begin() + 3);  // model.layers.0.self_attn.k_proj.weight
        write_bytes(file, safetensors_bytes(tensors));
        CHECK(contains(load_error(dir), "tensor 'model.layers.0.self_attn.k_proj.weight'"));
    }
    SUBCASE("a truncated file") {
        auto bytes = safetensors_bytes(checkpoint_tensors(weights, {"F32"}));
        bytes.resize(bytes.size() - 100);
        write_bytes(file, bytes);
        auto m = load_error(dir);
        CHECK(contains(m, "model.safetensors"));
        CHECK(contains(m, "tensor 'lm_head.weight'"));
        CHECK(contains(m, "run past"));
    }
    SUBCASE("a shard named by the index is missing") {
        std::string sharded = fresh_dir("bad_sharded");
        write_checkpoint(sharded, weights, {"F32"}, 2);
        std::filesystem::remove(sharded + "/model-00002-of-00002.safetensors");
        CHECK(contains(load_error(sharded), "model-00002-of-00002.safetensors: cannot open"));
    }
    SUBCASE("an untied config without lm_head") {
        auto tensors = checkpoint_tensors(weights, {"F32"});
        tensors.pop_back();
        write_bytes(file, safetensors_bytes(tensors));
        CHECK(contains(load_error(dir), "tensor 'lm_head.weight'"));
    }
}
