// How a page export travels over UCX: two tagged messages per transfer. The
// first is a small header (magic, version, element type, the caller's tag,
// the payload's size) followed by the export's descriptor as to_bytes()
// writes it for an export without rows (checksummed); the second is the
// payload alone, straight from and into the exports' own rows, so a large
// payload is never copied into a message buffer. The tag's top byte says
// which of the two a message is, the rest which transfer it belongs to.
// Before any transfer the receiver sends its worker address over the
// socket-address connection, and the sender sends its transfers over an
// endpoint made from that address: UCX's client-server connections use
// network transports only, the worker address lets it pick shared memory.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "kvcache/cache/page_transfer.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/span.hpp"

namespace kvcache::detail {

inline constexpr char ucx_wire_magic[8] = {'K', 'V', 'U', 'C', 'X', 'P', 'G', '\0'};
inline constexpr std::uint32_t ucx_wire_version = 1;
inline constexpr std::uint64_t ucx_header_kind = std::uint64_t(1) << 56;
inline constexpr std::uint64_t ucx_payload_kind = std::uint64_t(2) << 56;
inline constexpr std::uint64_t ucx_address_kind = std::uint64_t(3) << 56;  // the receiver's worker address
inline constexpr std::uint64_t ucx_kind_mask = std::uint64_t(0xff) << 56;
inline constexpr std::uint64_t ucx_transfer_mask = ~ucx_kind_mask;

/// The fixed part of a transfer's header message.
struct ucx_wire_header {
    char magic[8];
    std::uint32_t version;
    std::uint32_t element;
    std::uint64_t user_tag;
    std::uint64_t payload_bytes;
};

/// The export without its rows: what the header message describes.
template <class Element>
page_export<Element> descriptor_of(const page_export<Element>& e) {
    page_export<Element> d;
    d.element = e.element;
    d.layout = e.layout;
    d.heads = e.heads;
    d.shard_rank = e.shard_rank, d.shard_ranks = e.shard_ranks;
    d.page_size = e.page_size, d.layers = e.layers, d.length = e.length, d.first_page = e.first_page;
    d.scales = e.scales;
    d.tokens = e.tokens;
    d.page_hashes = e.page_hashes;
    d.page_checksums = e.page_checksums;
    d.kept = e.kept;
    return d;
}

/// Elements of the rows an export of this descriptor carries.
template <class Element>
std::size_t carried_elements(const page_export<Element>& d) {
    std::size_t n = 0;
    for (int p = d.first_page; p < d.page_count(); ++p) n += d.page_elements(p);
    return n;
}

/// The header message of export e, sent with the caller's tag.
template <class Element>
std::vector<unsigned char> ucx_header_message(const page_export<Element>& e, std::uint64_t user_tag) {
    ucx_wire_header h{};
    std::memcpy(h.magic, ucx_wire_magic, sizeof h.magic);
    h.version = ucx_wire_version;
    h.element = std::uint32_t(encode_kv_kinds(e.element));
    h.user_tag = user_tag;
    h.payload_bytes = e.payload_bytes();
    std::vector<unsigned char> out(sizeof h);
    std::memcpy(out.data(), &h, sizeof h);
    const std::vector<unsigned char> descriptor = to_bytes(descriptor_of(e));
    out.insert(out.end(), descriptor.begin(), descriptor.end());
    return out;
}

/// The export a header message describes, its rows sized (not yet filled)
/// for the payload message. format_error for another format or element type,
/// damaged descriptor bytes, or a payload size that disagrees with the pages.
template <class Element>
page_export<Element> ucx_parse_header(span<const unsigned char> message, std::uint64_t& user_tag,
                                      const std::string& peer) {
    ucx_wire_header h{};
    require(message.size() >= sizeof h, error_code::format_error, "the transfer header from peer ", peer, " has ",
            message.size(), " bytes, fewer than the ", sizeof h, " of its fixed part");
    std::memcpy(&h, message.data(), sizeof h);
    require(std::memcmp(h.magic, ucx_wire_magic, sizeof h.magic) == 0 && h.version == ucx_wire_version,
            error_code::format_error, "peer ", peer, " sent a message that is not a kvcache page transfer of version ",
            ucx_wire_version);
    page_export<Element> e =
        page_export_from_bytes<Element>(span<const unsigned char>(message.data() + sizeof h, message.size() - sizeof h));
    const std::size_t elements = carried_elements(e);
    constexpr std::size_t unit = sizeof(typename page_export<Element>::payload_element);
    require(h.payload_bytes == elements * unit, error_code::format_error, "peer ", peer, " announces ",
            h.payload_bytes, " payload bytes for pages that hold ", elements * unit);
    e.payload.resize(elements);
    user_tag = h.user_tag;
    return e;
}

}  // namespace kvcache::detail
