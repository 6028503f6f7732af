// The sending end of a page transfer over UCX: connects to a ucx_receiver's
// address (UCP client-server over a socket address; UCX then picks shared
// memory on one host, TCP or RDMA across hosts, see ucx_wire.hpp) and sends
// page exports, a bounded window of them in flight at once. Needs UCX
// (kvcache::ucx).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvcache/cache/page_transfer.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/transport/ucx_handles.hpp"
#include "kvcache/transport/ucx_wire.hpp"

namespace kvcache {

/// Sends page exports to one ucx_receiver. Each export goes as a header
/// message and a payload message sent from the export's own rows, registered
/// with UCX (ucp_mem_map) so a rendezvous transfer can go zero-copy; the
/// sender keeps the export until UCX is done with it. At most
/// options.window transfers are outstanding: send() waits for the oldest
/// beyond that. Every wait is bounded by options.timeout; a failed send, a
/// lost peer or a timeout is io_error naming the peer. Not copyable or
/// movable (UCX keeps pointers into it); one thread at a time.
class ucx_sender {
public:
    /// Connects to the receiver listening at host (an IPv4 address) and port
    /// and waits (options.accept_timeout) for its worker address, over which
    /// the transfers then go.
    ucx_sender(const std::string& host, std::uint16_t port, const ucx_options& options = {})
        : options_(options),
          address_(detail::ipv4_address(host, port)),
          worker_(options),
          control_(worker_, client_params(address_), host + ":" + std::to_string(port)) {
        ucp_tag_recv_info_t info{};
        ucp_tag_message_h message = nullptr;
        worker_.wait_for(
            options.accept_timeout,
            [&] {
                message = ucp_tag_probe_nb(worker_.get(), detail::ucx_address_kind, detail::ucx_kind_mask, 1, &info);
                return message != nullptr;
            },
            [&] { control_.check("the connection"); }, "the receiver's worker address", peer());
        std::vector<unsigned char> remote(info.length);
        ucp_request_param_t param{};
        const detail::ucx_request receive(
            worker_.get(), ucp_tag_msg_recv_nbx(worker_.get(), remote.data(), remote.size(), message, &param));
        worker_.wait([&] { return receive.done(); }, [&] { control_.check("the connection"); },
                     "the receiver's worker address", peer());
        detail::ucx_require(receive.status(), "receiving the receiver's worker address");
        ucp_ep_params_t data{};
        data.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        data.address = reinterpret_cast<const ucp_address_t*>(remote.data());
        // The control connection watches the receiver; this one may then take shared memory.
        endpoint_ = std::make_unique<detail::ucx_endpoint>(worker_, data, peer(), false);
    }
    /// Waits (bounded) for what is in flight, then closes the connection; a
    /// transfer still outstanding then is cancelled.
    ~ucx_sender() {
        bool clean = true;
        try {
            flush();
        } catch (const error&) {  // a destructor must not throw; the receiver sees the loss
            clean = false;
        }
        endpoint_->close(!clean);
        in_flight_.clear();  // after the close: nothing of UCX refers to the rows any more
    }
    ucx_sender(const ucx_sender&) = delete;
    ucx_sender& operator=(const ucx_sender&) = delete;

    /// Sends pages, with user_tag for the receiver (a request id, say). Takes
    /// the export (move it in to spare a copy) and keeps it until sent.
    /// @tparam Element the export's stored element type
    template <class Element>
    void send(page_export<Element> pages, std::uint64_t user_tag = 0) {
        while (int(in_flight_.size()) >= options_.window) finish_oldest();
        const std::uint64_t number = next_ & detail::ucx_transfer_mask;
        auto owned = std::make_shared<page_export<Element>>(std::move(pages));
        transfer t;
        t.header = detail::ucx_header_message(*owned, user_tag);
        t.memory = detail::ucx_registration(worker_.context(), owned->payload.data(), owned->payload_bytes());
        ucp_request_param_t param{};
        t.header_send = detail::ucx_request(
            worker_.get(), ucp_tag_send_nbx(endpoint_->get(), t.header.data(), t.header.size(),
                                            detail::ucx_header_kind | number, &param));
        if (t.memory.get() != nullptr) {
            param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
            param.memh = t.memory.get();
        }
        t.payload_send = detail::ucx_request(
            worker_.get(), ucp_tag_send_nbx(endpoint_->get(), owned->payload.data(), owned->payload_bytes(),
                                            detail::ucx_payload_kind | number, &param));
        t.rows = std::move(owned);
        in_flight_.push_back(std::move(t));
        ++next_;
        check(in_flight_.back());
    }

    /// Waits until every transfer sent so far has left (UCX completed it).
    void flush() {
        while (!in_flight_.empty()) finish_oldest();
    }

    /// Lets UCX advance the connection and the sends without waiting: a
    /// sender with nothing to send calls it now and then, so that its peer
    /// does not see it as gone.
    void progress() { ucp_worker_progress(worker_.get()); }

    /// Transfers outstanding.
    int in_flight() const noexcept { return int(in_flight_.size()); }
    /// The receiver's address, as errors name it.
    const std::string& peer() const noexcept { return control_.peer(); }
    /// What UCX chose for the transfers (lanes: transport and device each;
    /// the tag protocols' thresholds: eager, rendezvous); complete once a
    /// transfer has gone.
    std::string describe() const { return endpoint_->describe(); }

private:
    struct transfer {
        std::vector<unsigned char> header;
        std::shared_ptr<const void> rows;  // the export, kept until UCX is done with its payload
        detail::ucx_registration memory;
        detail::ucx_request header_send, payload_send;
    };

    static ucp_ep_params_t client_params(const sockaddr_in& address) {
        ucp_ep_params_t params{};
        params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
        params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
        params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
        params.sockaddr.addrlen = sizeof address;
        return params;
    }

    void check(const transfer& t) const {
        control_.check("a page transfer");
        endpoint_->check("a page transfer");
        for (const detail::ucx_request* r : {&t.header_send, &t.payload_send}) {
            const ucs_status_t s = r->status();
            require(s == UCS_OK || s == UCS_INPROGRESS, error_code::io_error, "sending a page transfer to peer ",
                    peer(), " failed: ", ucs_status_string(s));
        }
    }

    void finish_oldest() {
        const transfer& t = in_flight_.front();
        worker_.wait([&] { return t.header_send.done() && t.payload_send.done(); }, [&] { check(t); },
                     "a page transfer to complete", peer());
        check(t);
        in_flight_.pop_front();
    }

    ucx_options options_;
    sockaddr_in address_;
    detail::ucx_worker worker_;
    detail::ucx_endpoint control_;                    // the socket-address connection: watches the receiver
    std::unique_ptr<detail::ucx_endpoint> endpoint_;  // to the receiver's worker address: carries the transfers
    std::deque<transfer> in_flight_;
    std::uint64_t next_ = 0;
};

}  // namespace kvcache
