// Page exports between two processes over UCX on loopback (run once with
// UCX_TLS=tcp and once with UCX_TLS=shm): round trips equal, in a window;
// a sender killed mid-transfer, a silent sender and a missing receiver are
// io_error naming the peer, without a hang and with nothing imported; a
// damaged payload arrives but import_pages refuses it.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/kvcache.hpp"
#include "kvcache/transport.hpp"
#include "two_processes.hpp"

namespace {

using namespace kvcache;
using heads = head_config<8, 2, 32>;
using cache_type = paged_cache<float, heads>;
constexpr int row = 2 * 32;  // kv_heads x head_dim
constexpr int page = 16, layers = 2;

/// Row element i of token position p, layer l, key (0) or value (1) of request r: known to both processes.
float row_value(int request, int position, int layer, int kv, int i) {
    return float((request * 131 + position * 7 + layer * 13 + kv * 5 + i) % 97) / 97.0f - 0.5f;
}

/// A sequence of `length` tokens of request r, every layer written from row_value.
sequence_id add_request(cache_type& cache, int request, int length) {
    const sequence_id id = cache.add_sequence();
    std::vector<std::int32_t> tokens(length);
    for (int t = 0; t < length; ++t) tokens[t] = (request * 977 + t) % 2048;
    cache.begin_append(id, length, tokens);
    for (int l = 0; l < layers; ++l) {
        std::vector<float> k(std::size_t(length) * row), v(k.size());
        for (int t = 0; t < length; ++t)
            for (int i = 0; i < row; ++i) {
                k[std::size_t(t) * row + i] = row_value(request, t, l, 0, i);
                v[std::size_t(t) * row + i] = row_value(request, t, l, 1, i);
            }
        cache.write(id, l, 0, span<const float>(k), span<const float>(v), length);
    }
    cache.publish(id);
    return id;
}

/// Whether sequence id holds request r's rows, every layer.
bool holds_request(const cache_type& cache, sequence_id id, int request, int length) {
    if (cache.length(id) != length) return false;
    for (int l = 0; l < layers; ++l) {
        std::vector<float> k(std::size_t(length) * row), v(k.size());
        cache.read(id, l, 0, length, span<float>(k), span<float>(v));
        for (int t = 0; t < length; ++t)
            for (int i = 0; i < row; ++i)
                if (k[std::size_t(t) * row + i] != row_value(request, t, l, 0, i) ||
                    v[std::size_t(t) * row + i] != row_value(request, t, l, 1, i))
                    return false;
    }
    return true;
}

/// The export of request r, from a cache of its own.
page_export<float> export_request(int request, int length) {
    cache_type cache(layers, (length + page - 1) / page, page);
    return export_pages(cache, add_request(cache, request, length));
}

/// Options whose waits for a transfer end after milliseconds (a connection may take its default).
ucx_options short_waits(int milliseconds) {
    ucx_options o;
    o.timeout = std::chrono::milliseconds(milliseconds);
    return o;
}

/// The transports UCX_TLS asks for, as ucp_ep_print_info names their lanes.
bool lanes_match_environment(const std::string& lanes) {
    const char* tls = std::getenv("UCX_TLS");
    const std::string wanted = tls ? tls : "";
    if (wanted == "tcp") return lanes.find("tcp/") != std::string::npos && lanes.find("posix/") == std::string::npos;
    if (wanted.compare(0, 3, "shm") == 0)  // "shm,tcp": TCP for the socket-address connection only
        return lanes.find("tcp/") == std::string::npos &&
               (lanes.find("posix/") != std::string::npos || lanes.find("sysv/") != std::string::npos);
    return !lanes.empty();
}

/// The message of the io_error receive() ends in; a receive that returns, or another error, fails the test.
std::string failed_receive(ucx_receiver& receiver) {
    try {
        (void)receiver.receive<float>();
    } catch (const error& e) {
        CHECK(e.code() == error_code::io_error);
        MESSAGE((std::string(e.what())));
        return e.what();
    }
    FAIL("the receive returned");
    return "";
}

const std::vector<int> lengths = {1, 16, 37, 2048, 300};  // one page partial, one whole, 2 MiB, ...

}  // namespace

TEST_CASE("exports sent in a window arrive in order and import equal to the sender's rows") {
    ucx_options options;
    options.window = 2;
    const auto end = testing::two_processes(
        options,
        [&](std::uint16_t port) {
            ucx_sender sender("127.0.0.1", port, options);
            for (int r = 0; r < int(lengths.size()); ++r) sender.send(export_request(r, lengths[r]), 1000 + r);
            sender.flush();
            const std::string lanes = sender.describe();
            std::printf("UCX_TLS=%s; the sender's lanes:\n%s", std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "(unset)",
                        lanes.c_str());
            return lanes_match_environment(lanes) ? 0 : 4;
        },
        [&](ucx_receiver& receiver) {
            int pages = 0;
            for (int length : lengths) pages += (length + page - 1) / page;
            cache_type cache(layers, pages, page);
            for (int r = 0; r < int(lengths.size()); ++r) {
                received_pages<float> got = receiver.receive<float>();
                CHECK(got.user_tag == std::uint64_t(1000 + r));
                CHECK(got.bytes > std::size_t(lengths[r]) * row * 2 * layers * sizeof(float));
                const sequence_id id = import_pages(cache, got.pages);
                CHECK(holds_request(cache, id, r, lengths[r]));
            }
        });
    CHECK(end.exit_status == 0);  // 4: the lanes are not the transports UCX_TLS names
}

TEST_CASE("a sender killed after the header is io_error naming it; nothing arrives, nothing hangs") {
    std::string peer;
    const auto end = testing::two_processes(
        short_waits(5000),
        [&](std::uint16_t port) {
            // The header alone, then death: the receiver is left waiting for a payload that never comes.
            const ucx_options options = short_waits(5000);
            detail::ucx_worker worker(options);
            const sockaddr_in address = detail::ipv4_address("127.0.0.1", port);
            ucp_ep_params_t params{};
            params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
            params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
            params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
            params.sockaddr.addrlen = sizeof address;
            detail::ucx_endpoint ep(worker, params, "receiver");
            const auto header = detail::ucx_header_message(export_request(0, 2048), 7);
            ucp_request_param_t param{};
            const detail::ucx_request send(
                worker.get(), ucp_tag_send_nbx(ep.get(), header.data(), header.size(), detail::ucx_header_kind, &param));
            worker.wait([&] { return send.done(); }, [] {}, "the header", "receiver");
            std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the receiver takes the header meanwhile
            raise(SIGKILL);
            return 0;
        },
        [&](ucx_receiver& receiver) {
            const auto start = std::chrono::steady_clock::now();
            cache_type cache(layers, 256, page);
            const std::string message = failed_receive(receiver);
            CHECK(message.find("peer " + receiver.peer()) != std::string::npos);
            CHECK(message.find("payload") != std::string::npos);  // the header had come
            peer = receiver.peer();
            CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(4900));  // the loss, not the timeout
            CHECK(cache.sequence_count() == 0);
        });
    CHECK(end.signal == SIGKILL);
    CHECK(peer.find("127.0.0.1:") == 0);
}

TEST_CASE("a sender killed while its payload is under way is io_error naming it") {
    const auto end = testing::two_processes(
        short_waits(5000),
        [&](std::uint16_t port) {
            ucx_sender sender("127.0.0.1", port, short_waits(5000));
            sender.send(export_request(0, 16));
            sender.flush();                         // connected, one transfer done
            sender.send(export_request(1, 32768));  // 32 MiB
            raise(SIGKILL);                         // with the transfer in flight
            return 0;
        },
        [&](ucx_receiver& receiver) {
            CHECK(receiver.receive<float>().pages.length == 16);
            const auto start = std::chrono::steady_clock::now();
            CHECK(failed_receive(receiver).find("peer 127.0.0.1:") != std::string::npos);
            CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(4900));  // the loss, not the timeout
        });
    CHECK(end.signal == SIGKILL);
}

TEST_CASE("a sender that never sends is a timeout, io_error naming the peer") {
    const auto end = testing::two_processes(
        short_waits(300),
        [&](std::uint16_t port) {
            ucx_sender sender("127.0.0.1", port, short_waits(300));
            const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
            while (std::chrono::steady_clock::now() < until) sender.progress();  // alive, connected and silent
            return sender.in_flight();
        },
        [&](ucx_receiver& receiver) {
            receiver.accept();
            CHECK(failed_receive(receiver).find("timed out after 300 ms waiting for a page transfer's header (peer 127.0.0.1:") != std::string::npos);
        });
    CHECK(end.exit_status == 0);
}

TEST_CASE("no sender and no receiver: accept and send time out or fail naming the address") {
    ucx_options options = short_waits(200);
    options.accept_timeout = std::chrono::milliseconds(200);
    ucx_receiver receiver(options);
    CHECK_THROWS_WITH_AS(receiver.accept(), doctest::Contains("timed out after 200 ms waiting for a sender to connect"),
                         error);
    try {
        ucx_options sender_options = short_waits(500);
        sender_options.accept_timeout = std::chrono::milliseconds(3000);
        ucx_sender sender("127.0.0.1", 1, sender_options);  // port 1: nothing listens there
        sender.send(export_request(0, 16));
        sender.flush();
        FAIL("the send completed");
    } catch (const error& e) {
        CHECK(e.code() == error_code::io_error);
        MESSAGE((std::string(e.what())));
        CHECK(std::string(e.what()).find("peer 127.0.0.1:1 was lost") != std::string::npos);  // refused, not timed out
    }
}

TEST_CASE("a payload damaged in transit arrives, and import_pages refuses it with the cache unchanged") {
    const auto end = testing::two_processes(
        {},
        [&](std::uint16_t port) {
            ucx_sender sender("127.0.0.1", port);
            page_export<float> e = export_request(2, 100);
            e.payload[5 * row + 3] += 1.0f;  // after the checksums were taken: page 0 is damaged
            sender.send(std::move(e));
            sender.flush();
            return 0;
        },
        [&](ucx_receiver& receiver) {
            cache_type cache(layers, 16, page);
            const received_pages<float> got = receiver.receive<float>();
            CHECK_THROWS_WITH_AS(import_pages(cache, got.pages),
                                 doctest::Contains("page 0 of the export is damaged (checksum mismatch)"), error);
            CHECK(cache.sequence_count() == 0);
            CHECK(cache.statistics().pages_free == 16);
        });
    CHECK(end.exit_status == 0);
}

TEST_CASE("options out of range are refused before anything connects") {
    ucx_options no_window;
    no_window.window = 0;
    CHECK_THROWS_WITH_AS(ucx_sender("127.0.0.1", 1, no_window), doctest::Contains("the send window 0 must be positive"),
                         error);
    CHECK_THROWS_WITH_AS(ucx_receiver(short_waits(0)), doctest::Contains("UCX timeouts (0 ms"), error);
    CHECK_THROWS_WITH_AS(ucx_sender("localhost", 1), doctest::Contains("'localhost' is not an IPv4 address"), error);
}
