// The UCX objects a page transfer needs, each owned by one RAII handle: the
// context and worker (ucx_worker), an endpoint, a memory registration and an
// outstanding request. Every wait progresses the worker against a deadline
// and ends in a kvcache::error, io_error, naming the peer: a peer that never
// answers or goes away is an error, never a hang. Needs UCX (kvcache::ucx).
#pragma once

#include <ucp/api/ucp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "kvcache/core/error.hpp"

namespace kvcache {

/// How a UCX transfer end is set up.
struct ucx_options {
    std::chrono::milliseconds timeout{10000};  ///< the longest any one wait of a transfer (send, receive) may take
    std::chrono::milliseconds accept_timeout{30000};  ///< the longest a receiver waits for its sender to connect
    int window = 4;                            ///< transfers a sender keeps in flight before it waits for the oldest
    std::string transports;                    ///< UCX_TLS for this end ("tcp", "shm", ...); empty: UCX's default or the environment's
};

namespace detail {

/// Throws io_error naming what failed and UCX's reason unless status is UCS_OK.
inline void ucx_require(ucs_status_t status, const char* what) {
    require(status == UCS_OK, error_code::io_error, "UCX ", what, " failed: ", ucs_status_string(status));
}

/// "address:port" of a socket address (IPv4 or IPv6).
inline std::string address_text(const sockaddr_storage& address) {
    char text[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (address.ss_family == AF_INET) {
        const auto& a = reinterpret_cast<const sockaddr_in&>(address);
        inet_ntop(AF_INET, &a.sin_addr, text, sizeof text);
        port = ntohs(a.sin_port);
    } else if (address.ss_family == AF_INET6) {
        const auto& a = reinterpret_cast<const sockaddr_in6&>(address);
        inet_ntop(AF_INET6, &a.sin6_addr, text, sizeof text);
        port = ntohs(a.sin6_port);
    }
    return std::string(text) + ":" + std::to_string(port);
}

/// The IPv4 socket address of host (a dotted address) and port; invalid_argument for another text.
inline sockaddr_in ipv4_address(const std::string& host, std::uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    require(inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1, error_code::invalid_argument, "'", host,
            "' is not an IPv4 address");
    return a;
}

/// A UCP context and one worker (single-threaded use), made for the tag API,
/// with the options' transports; everything else of a transfer end lives on it.
class ucx_worker {
public:
    explicit ucx_worker(const ucx_options& options) : timeout_(options.timeout) {
        require(options.timeout.count() > 0 && options.accept_timeout.count() > 0, error_code::invalid_argument,
                "the UCX timeouts (", options.timeout.count(), " ms, accept ", options.accept_timeout.count(),
                " ms) must be positive");
        require(options.window > 0, error_code::invalid_argument, "the send window ", options.window,
                " must be positive");
        ucp_config_t* config = nullptr;
        ucx_require(ucp_config_read(nullptr, nullptr, &config), "reading the configuration");
        if (!options.transports.empty()) {
            const ucs_status_t s = ucp_config_modify(config, "TLS", options.transports.c_str());
            if (s != UCS_OK) ucp_config_release(config);
            require(s == UCS_OK, error_code::invalid_argument, "UCX refuses transports '", options.transports,
                    "': ", ucs_status_string(s));
        }
        ucp_params_t params{};
        params.field_mask = UCP_PARAM_FIELD_FEATURES;
        params.features = UCP_FEATURE_TAG;
        const ucs_status_t s = ucp_init(&params, config, &context_);
        ucp_config_release(config);
        ucx_require(s, "context initialisation");
        ucp_worker_params_t worker{};
        worker.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        worker.thread_mode = UCS_THREAD_MODE_SINGLE;
        const ucs_status_t w = ucp_worker_create(context_, &worker, &worker_);
        if (w != UCS_OK) ucp_cleanup(context_);
        ucx_require(w, "worker creation");
    }
    ~ucx_worker() {
        ucp_worker_destroy(worker_);
        ucp_cleanup(context_);
    }
    ucx_worker(const ucx_worker&) = delete;
    ucx_worker& operator=(const ucx_worker&) = delete;

    ucp_context_h context() const noexcept { return context_; }
    ucp_worker_h get() const noexcept { return worker_; }
    std::chrono::milliseconds timeout() const noexcept { return timeout_; }

    /// Progresses the worker until done() holds. failed() is asked after
    /// each round and throws what went wrong; past the timeout it is io_error
    /// naming what was awaited and from whom.
    template <class Done, class Failed>
    void wait(Done&& done, Failed&& failed, const char* what, const std::string& peer) const {
        wait_for(timeout_, done, failed, what, peer);
    }
    /// The same with a timeout of its own.
    template <class Done, class Failed>
    void wait_for(std::chrono::milliseconds timeout, Done&& done, Failed&& failed, const char* what,
                  const std::string& peer) const {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        constexpr auto idle_spin = std::chrono::microseconds(50);
        auto idle_since = std::chrono::steady_clock::now();
        for (;;) {
            const unsigned progressed = ucp_worker_progress(worker_);
            if (done()) return;
            failed();
            if (std::chrono::steady_clock::now() > deadline)
                throw_error(error_code::io_error, "timed out after ", timeout.count(), " ms waiting for ", what,
                            " (peer ", peer, ")");
            // Spin while UCX has work; idle past idle_spin, nap briefly so that a peer sharing
            // the cores (shared memory: the peer's CPU does the copy) gets them.
            const auto now = std::chrono::steady_clock::now();
            if (progressed != 0) idle_since = now;
            else if (now - idle_since > idle_spin) std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }

private:
    std::chrono::milliseconds timeout_;
    ucp_context_h context_ = nullptr;
    ucp_worker_h worker_ = nullptr;
};

/// An outstanding UCX request (or an operation that completed at once). On
/// destruction an unfinished request is cancelled and progressed to its end
/// (bounded), so the buffer it names may go right after.
class ucx_request {
public:
    ucx_request() = default;
    ucx_request(ucp_worker_h worker, ucs_status_ptr_t request) : worker_(worker), request_(request) {}
    ucx_request(ucx_request&& other) noexcept : worker_(other.worker_), request_(other.request_) {
        other.request_ = nullptr;
    }
    ucx_request& operator=(ucx_request&& other) noexcept {
        if (this != &other) {
            release();
            worker_ = other.worker_;
            request_ = std::exchange(other.request_, nullptr);
        }
        return *this;
    }
    ~ucx_request() { release(); }

    /// UCS_INPROGRESS while running, else how it ended.
    ucs_status_t status() const {
        if (request_ == nullptr) return UCS_OK;
        if (UCS_PTR_IS_ERR(request_)) return UCS_PTR_STATUS(request_);
        return ucp_request_check_status(request_);
    }
    bool done() const { return status() != UCS_INPROGRESS; }

private:
    void release() noexcept {
        if (request_ == nullptr || !UCS_PTR_IS_PTR(request_)) return;
        if (ucp_request_check_status(request_) == UCS_INPROGRESS) {
            ucp_request_cancel(worker_, request_);
            // A cancelled request ends within a few progress rounds; a bound keeps a broken peer from hanging us.
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
            while (ucp_request_check_status(request_) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline)
                ucp_worker_progress(worker_);
        }
        ucp_request_free(request_);
        request_ = nullptr;
    }

    ucp_worker_h worker_ = nullptr;
    ucs_status_ptr_t request_ = nullptr;
};

/// Memory registered with UCX (ucp_mem_map of the caller's bytes), so a
/// rendezvous transfer can go zero-copy where the transport supports it.
class ucx_registration {
public:
    ucx_registration() = default;
    ucx_registration(ucp_context_h context, void* data, std::size_t bytes) : context_(context) {
        if (bytes == 0) return;
        ucp_mem_map_params_t params{};
        params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        params.address = data;
        params.length = bytes;
        ucx_require(ucp_mem_map(context, &params, &memh_), "memory registration");
    }
    ucx_registration(ucx_registration&& other) noexcept
        : context_(other.context_), memh_(std::exchange(other.memh_, nullptr)) {}
    ucx_registration& operator=(ucx_registration&& other) noexcept {
        if (this != &other) {
            release();
            context_ = other.context_;
            memh_ = std::exchange(other.memh_, nullptr);
        }
        return *this;
    }
    ~ucx_registration() { release(); }

    /// The handle a request names the memory by (null for no bytes).
    ucp_mem_h get() const noexcept { return memh_; }

private:
    void release() noexcept {
        if (memh_ != nullptr) ucp_mem_unmap(context_, memh_);
        memh_ = nullptr;
    }

    ucp_context_h context_ = nullptr;
    ucp_mem_h memh_ = nullptr;
};

/// A connected endpoint, with peer error handling where asked: a peer that
/// fails or goes away marks it failed (failure()), which every wait turns
/// into io_error.
/// Closing flushes it (forced when it failed), bounded by the worker's timeout.
class ucx_endpoint {
public:
    /// watch_peer: UCP's peer error handling mode, which restricts UCX to
    /// transports that detect a lost peer (shared memory does not, in UCX 1.13).
    ucx_endpoint(const ucx_worker& worker, ucp_ep_params_t params, std::string peer, bool watch_peer = true)
        : worker_(worker), peer_(std::move(peer)) {
        params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
        params.err_mode = watch_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
        params.err_handler.cb = &ucx_endpoint::on_error;
        params.err_handler.arg = &failure_;
        ucx_require(ucp_ep_create(worker.get(), &params, &ep_), "endpoint creation");
    }
    ~ucx_endpoint() { close(false); }
    ucx_endpoint(const ucx_endpoint&) = delete;
    ucx_endpoint& operator=(const ucx_endpoint&) = delete;

    /// Closes the endpoint once: flushed, or forced (outstanding operations
    /// end as cancelled) when asked or when the peer is lost.
    void close(bool force) noexcept {
        if (ep_ == nullptr) return;
        ucp_request_param_t close{};
        close.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        close.flags = force || failure_ != UCS_OK ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        ucs_status_ptr_t request = ucp_ep_close_nbx(std::exchange(ep_, nullptr), &close);
        if (UCS_PTR_IS_PTR(request)) {
            const auto deadline = std::chrono::steady_clock::now() + worker_.timeout();
            while (ucp_request_check_status(request) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline)
                ucp_worker_progress(worker_.get());
            ucp_request_free(request);  // an unfinished close is released by UCX when it ends
        }
    }

    ucp_ep_h get() const noexcept { return ep_; }
    const std::string& peer() const noexcept { return peer_; }
    /// UCS_OK, or why the peer was lost.
    ucs_status_t failure() const noexcept { return failure_; }
    /// Throws io_error naming the peer once it was lost, and what was under way.
    void check(const char* what) const {
        require(failure_ == UCS_OK, error_code::io_error, "peer ", peer_, " was lost during ", what, ": ",
                ucs_status_string(failure_));
    }

    /// What UCX chose for this endpoint: its lanes (transport and device
    /// each) and the tag protocols' thresholds (eager, rendezvous), one line each.
    std::string describe() const {
        char* text = nullptr;
        std::size_t size = 0;
        FILE* stream = open_memstream(&text, &size);
        if (stream == nullptr) return "";
        ucp_ep_print_info(ep_, stream);
        std::fclose(stream);
        std::string lines, all(text, size);
        std::free(text);
        for (std::size_t at = 0; at < all.size();) {
            std::size_t end = all.find('\n', at);
            if (end == std::string::npos) end = all.size();
            std::string line = all.substr(at, end - at);
            at = end + 1;
            const std::size_t first = line.find_first_not_of("# \t");
            if (first == std::string::npos) continue;
            line = line.substr(first);
            if (line.compare(0, 5, "lane[") == 0 || line.compare(0, 9, "tag_send:") == 0) lines += line + "\n";
        }
        return lines;
    }

private:
    static void on_error(void* arg, ucp_ep_h, ucs_status_t status) { *static_cast<ucs_status_t*>(arg) = status; }

    const ucx_worker& worker_;
    std::string peer_;
    ucs_status_t failure_ = UCS_OK;
    ucp_ep_h ep_ = nullptr;
};

}  // namespace detail
}  // namespace kvcache
