// Sequence ids and the small host-side helpers every cache owner shares:
// the id registry and the index tables that views point into.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "kvcache/core/error.hpp"
#include "kvcache/core/memory.hpp"

namespace kvcache {

/// Names a sequence held by a cache owner. Ids are never reused by one owner.
using sequence_id = std::int64_t;

namespace detail {

/// Sequence states keyed by id, in id order (so saves are deterministic).
/// @tparam State per-sequence bookkeeping of an owner
template <class State>
class sequence_registry {
public:
    /// The state of id; throws error_code::not_found naming the id.
    State& at(sequence_id id) {
        auto found = states_.find(id);
        if (found == states_.end()) missing(id);
        return found->second;
    }
    const State& at(sequence_id id) const {
        auto found = states_.find(id);
        if (found == states_.end()) missing(id);
        return found->second;
    }
    bool contains(sequence_id id) const { return states_.count(id) != 0; }
    std::size_t size() const noexcept { return states_.size(); }

    /// Adds a state under a fresh id.
    sequence_id insert(State state) {
        states_.emplace(next_, std::move(state));
        return next_++;
    }
    void erase(sequence_id id) { states_.erase(id); }

    /// Every id held, ascending.
    std::vector<sequence_id> ids() const {
        std::vector<sequence_id> out;
        out.reserve(states_.size());
        for (const auto& entry : states_) out.push_back(entry.first);
        return out;
    }
    /// Throws not_found unless every id is held (checked before any change).
    void require_all(const std::vector<sequence_id>& ids) const {
        for (sequence_id id : ids) (void)at(id);
    }

    auto begin() { return states_.begin(); }
    auto end() { return states_.end(); }
    auto begin() const { return states_.begin(); }
    auto end() const { return states_.end(); }

private:
    [[noreturn]] void missing(sequence_id id) const {
        throw_error(error_code::not_found, "sequence id ", id, " is not in the cache (", states_.size(),
                    " sequences held, next new id ", next_, ")");
    }

    std::map<sequence_id, State> states_;
    sequence_id next_ = 0;
};

/// An int table in the owner's memory space (lengths, slots, page tables)
/// that views point into. It is rewritten only when its contents change, so
/// views of every layer made for the same batch share it and stay valid.
/// @tparam Memory host_memory or device_memory
template <class Memory>
class index_table {
public:
    /// Uploads values (if different from the last upload) and returns where they live.
    const int* upload(const std::vector<int>& values) {
        if (values.empty()) return nullptr;
        if (values == host_ && buffer_.size() >= values.size()) return buffer_.data();
        if (buffer_.size() < values.size()) {
            typename Memory::template buffer<int> grown(std::max(values.size(), 2 * buffer_.size()));
            buffer_ = std::move(grown);
        }
        Memory::copy_from_host(buffer_.data(), values.data(), values.size() * sizeof(int));
        host_ = values;
        return buffer_.data();
    }

    /// Keeps the batch's sequence ids in host memory for the view's messages
    /// (views name a bad entry by id); valid as long as the table is.
    const std::int64_t* label(const std::vector<sequence_id>& batch) {
        ids_ = batch;
        return ids_.empty() ? nullptr : ids_.data();
    }

private:
    std::vector<int> host_;
    typename Memory::template buffer<int> buffer_;
    std::vector<sequence_id> ids_;
};

/// Throws invalid_argument unless 0 <= n.
inline void require_count(int n, const char* what) {
    require(n >= 0, error_code::invalid_argument, what, " = ", n, " must not be negative");
}

/// Throws invalid_argument unless 0 < n: the owners' constructor sizes.
inline void require_positive(int n, const char* what) {
    require(n > 0, error_code::invalid_argument, what, " = ", n, " must be positive");
}

}  // namespace detail
}  // namespace kvcache
