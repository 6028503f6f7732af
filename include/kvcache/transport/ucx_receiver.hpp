// The receiving end of a page transfer over UCX: listens on a socket
// address, accepts one sender and receives its page exports into freshly
// allocated, registered rows, ready for import_pages. Needs UCX (kvcache::ucx).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvcache/cache/page_transfer.hpp"
#include "kvcache/core/error.hpp"
#include "kvcache/core/span.hpp"
#include "kvcache/transport/ucx_handles.hpp"
#include "kvcache/transport/ucx_wire.hpp"

namespace kvcache {

/// One export as it arrived, with the sender's tag and what the transfer took.
/// @tparam Element the export's stored element type
template <class Element>
struct received_pages {
    page_export<Element> pages;  ///< checked by import_pages (descriptor, each page's checksum)
    std::uint64_t user_tag = 0;  ///< what the sender passed to send()
    std::size_t bytes = 0;       ///< header and payload bytes received
    double seconds = 0;          ///< from the header's arrival to the payload's end
};

/// Receives page exports from one ucx_sender. Listens at construction (port
/// 0: one the system picks, see port()); accept() waits for the sender;
/// receive() returns the next export in the order sent. Every wait is bounded
/// by options.timeout. A sender lost mid-transfer, a failed receive or a
/// timeout is io_error naming the peer: what had arrived is freed and nothing
/// is returned. Not copyable or movable (UCX keeps pointers into it); one
/// thread at a time.
class ucx_receiver {
public:
    /// Listens on address (IPv4, e.g. "127.0.0.1" or "0.0.0.0") and port.
    explicit ucx_receiver(const ucx_options& options = {}, const std::string& address = "127.0.0.1",
                          std::uint16_t port = 0)
        : accept_timeout_(options.accept_timeout), worker_(options), listener_(worker_, detail::ipv4_address(address, port), *this) {}
    ~ucx_receiver() {
        endpoint_.reset();  // before the listener and worker it lives on
        if (pending_ != nullptr) ucp_listener_reject(listener_.get(), pending_);
    }
    ucx_receiver(const ucx_receiver&) = delete;
    ucx_receiver& operator=(const ucx_receiver&) = delete;

    /// The port it listens on.
    std::uint16_t port() const { return listener_.port(); }

    /// Waits for a sender to connect and accepts it; io_error past options.accept_timeout.
    void accept() {
        require(endpoint_ == nullptr, error_code::invalid_argument, "the receiver already accepted peer ", peer());
        worker_.wait_for(accept_timeout_, [&] { return pending_ != nullptr; }, [] {}, "a sender to connect",
                     "on port " + std::to_string(port()));
        ucp_conn_request_attr_t attr{};
        attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
        std::string name = "unknown";
        if (ucp_conn_request_query(pending_, &attr) == UCS_OK) name = detail::address_text(attr.client_address);
        ucp_ep_params_t params{};
        params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
        params.conn_request = std::exchange(pending_, nullptr);
        auto endpoint = std::make_unique<detail::ucx_endpoint>(worker_, params, name);
        // Our worker address, for the sender's data endpoint (see ucx_wire.hpp).
        ucp_address_t* address = nullptr;
        std::size_t length = 0;
        detail::ucx_require(ucp_worker_get_address(worker_.get(), &address, &length), "worker address query");
        const std::vector<unsigned char> bytes(reinterpret_cast<unsigned char*>(address),
                                               reinterpret_cast<unsigned char*>(address) + length);
        ucp_worker_release_address(worker_.get(), address);
        ucp_request_param_t param{};
        const detail::ucx_request send(
            worker_.get(), ucp_tag_send_nbx(endpoint->get(), bytes.data(), bytes.size(), detail::ucx_address_kind, &param));
        worker_.wait([&] { return send.done(); }, [&] { endpoint->check("sending the worker address"); },
                     "the worker address to reach the sender", name);
        detail::ucx_require(send.status(), "sending the worker address");
        endpoint_ = std::move(endpoint);
    }

    /// Receives the next export; accepts the sender first if none is.
    /// format_error for a message that is not a transfer of Element rows.
    /// @tparam Element the stored element type the sender's exports hold
    template <class Element>
    received_pages<Element> receive() {
        if (endpoint_ == nullptr) accept();
        const detail::ucx_endpoint& ep = *endpoint_;
        ucp_tag_recv_info_t info{};
        ucp_tag_message_h message = nullptr;
        worker_.wait(
            [&] {
                message = ucp_tag_probe_nb(worker_.get(), detail::ucx_header_kind, detail::ucx_kind_mask, 1, &info);
                return message != nullptr;
            },
            [&] { ep.check("a wait for a page transfer"); }, "a page transfer's header", ep.peer());
        const auto start = std::chrono::steady_clock::now();
        std::vector<unsigned char> header(info.length);
        ucp_request_param_t param{};
        detail::ucx_request header_receive(
            worker_.get(), ucp_tag_msg_recv_nbx(worker_.get(), header.data(), header.size(), message, &param));
        finish(header_receive, "a page transfer's header");
        received_pages<Element> r;
        r.pages = detail::ucx_parse_header<Element>(span<const unsigned char>(header), r.user_tag, ep.peer());
        const std::uint64_t number = info.sender_tag & detail::ucx_transfer_mask;
        const detail::ucx_registration memory(worker_.context(), r.pages.payload.data(), r.pages.payload_bytes());
        if (memory.get() != nullptr) {
            param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
            param.memh = memory.get();
        }
        detail::ucx_request payload_receive(
            worker_.get(), ucp_tag_recv_nbx(worker_.get(), r.pages.payload.data(), r.pages.payload_bytes(),
                                            detail::ucx_payload_kind | number, ~std::uint64_t(0), &param));
        finish(payload_receive, "a page transfer's payload");
        r.bytes = header.size() + r.pages.payload_bytes();
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return r;
    }

    /// The accepted sender's address ("unknown" before accept()).
    std::string peer() const { return endpoint_ ? endpoint_->peer() : "unknown"; }
    /// What UCX chose for the socket-address connection that watches the
    /// sender (lanes); the sender's describe() tells what carries the transfers.
    std::string describe() const { return endpoint_ ? endpoint_->describe() : ""; }

private:
    /// The listener; a connection request waits in pending_ for accept(), a second one is refused.
    class listener {
    public:
        listener(const detail::ucx_worker& worker, const sockaddr_in& address, ucx_receiver& owner) {
            ucp_listener_params_t params{};
            params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
            params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
            params.sockaddr.addrlen = sizeof address;
            params.conn_handler.cb = &listener::on_connect;
            params.conn_handler.arg = &owner;
            detail::ucx_require(ucp_listener_create(worker.get(), &params, &listener_), "listener creation");
        }
        ~listener() { ucp_listener_destroy(listener_); }
        listener(const listener&) = delete;
        listener& operator=(const listener&) = delete;

        ucp_listener_h get() const noexcept { return listener_; }
        std::uint16_t port() const {
            ucp_listener_attr_t attr{};
            attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
            detail::ucx_require(ucp_listener_query(listener_, &attr), "listener query");
            const std::string text = detail::address_text(attr.sockaddr);
            return std::uint16_t(std::stoi(text.substr(text.rfind(':') + 1)));
        }

    private:
        static void on_connect(ucp_conn_request_h request, void* arg) {
            auto& owner = *static_cast<ucx_receiver*>(arg);
            if (owner.pending_ != nullptr || owner.endpoint_ != nullptr)
                ucp_listener_reject(owner.listener_.get(), request);  // one sender per receiver
            else
                owner.pending_ = request;
        }

        ucp_listener_h listener_ = nullptr;
    };

    void finish(const detail::ucx_request& request, const char* what) const {
        const detail::ucx_endpoint& ep = *endpoint_;
        worker_.wait([&] { return request.done(); }, [&] { ep.check(what); }, what, ep.peer());
        const ucs_status_t s = request.status();
        require(s == UCS_OK, error_code::io_error, "receiving ", what, " from peer ", ep.peer(),
                " failed: ", ucs_status_string(s));
    }

    std::chrono::milliseconds accept_timeout_;
    detail::ucx_worker worker_;
    listener listener_;
    ucp_conn_request_h pending_ = nullptr;
    std::unique_ptr<detail::ucx_endpoint> endpoint_;
};

}  // namespace kvcache
