// Must not compile: append writes the cache, and a view of const elements is read-only.
#include <vector>

#include "kvcache/backend/operation_params.hpp"
#include "kvcache/layout/contiguous_view.hpp"
int main() {
    using heads = kvcache::head_config<2, 1, 8>;
    const std::vector<float> keys(16), values(16);
    const std::vector<int> lengths = {1}, offsets = {0, 1};
    const auto view = kvcache::contiguous_view<const float, heads>::packed(keys.data(), values.data(), lengths.data(),
                                                                           nullptr, 1, 2);
    kvcache::append_params call(view, keys, values, offsets);
    return call.new_token_offsets[0];
}
