// A receiver here and a sender in a forked child, over loopback: the child
// learns the receiver's port through a pipe, runs its part and exits with
// its status; the parent waits for it with a bound and kills it past that.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <thread>

#include "kvcache/transport/ucx_receiver.hpp"

namespace kvcache::testing {

/// How the child ended: its exit status, a signal, or killed by the wait's bound.
struct child_end {
    int exit_status = -1;  ///< its exit status, -1 when a signal ended it
    int signal = 0;        ///< the signal that ended it, 0 when it exited
    bool overran = false;  ///< still running past the bound: killed
};

/// Runs child(port) in a forked process (its return value its exit status,
/// an exception status 3) and parent(receiver) here with a receiver made
/// from options; returns how the child ended.
template <class Child, class Parent>
child_end two_processes(const ucx_options& options, Child&& child, Parent&& parent) {
    int fds[2];
    if (pipe(fds) != 0) throw error(error_code::io_error, "pipe failed");
    std::fflush(nullptr);  // nothing buffered twice
    const pid_t pid = fork();
    if (pid < 0) throw error(error_code::io_error, "fork failed");
    if (pid == 0) {
        close(fds[1]);
        std::uint16_t port = 0;
        int status = 3;
        if (read(fds[0], &port, sizeof port) == sizeof port) {
            try {
                status = child(port);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "child: %s\n", e.what());
            }
        }
        std::fflush(nullptr);
        _exit(status);
    }
    close(fds[0]);
    child_end end;
    std::exception_ptr failure;  // the parent's (a failed check's), rethrown once the child is reaped
    try {
        ucx_receiver receiver(options);
        const std::uint16_t port = receiver.port();
        const bool told = write(fds[1], &port, sizeof port) == sizeof port;
        close(fds[1]);
        fds[1] = -1;
        if (told) parent(receiver);
    } catch (...) {
        failure = std::current_exception();
    }
    if (fds[1] >= 0) close(fds[1]);
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            end.overran = true;
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (failure) std::rethrow_exception(failure);
    if (!end.overran && WIFEXITED(status)) end.exit_status = WEXITSTATUS(status);
    if (!end.overran && WIFSIGNALED(status)) end.signal = WTERMSIG(status);
    return end;
}

}  // namespace kvcache::testing
