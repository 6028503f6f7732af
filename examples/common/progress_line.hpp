// A progress line on stderr for long runs: rewritten in place on a terminal,
// one line at a time otherwise (logs), at most once a second.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace kvcache::examples {

/// Prints a progress line at most once a second, so long runs show they are alive.
class progress_line {
public:
    progress_line() : tty_(isatty(fileno(stderr)) != 0), last_(std::chrono::steady_clock::now()) {}
    void update(const std::string& text) {
        auto now = std::chrono::steady_clock::now();
        if (now - last_ < std::chrono::seconds(1)) return;
        last_ = now;
        std::fprintf(stderr, tty_ ? "\r  %-60s" : "  %s\n", text.c_str());
        std::fflush(stderr);
        shown_ = true;
    }
    void clear() {
        if (shown_ && tty_) std::fprintf(stderr, "\r%-64s\r", "");
        shown_ = false;
    }

private:
    bool tty_;
    bool shown_ = false;
    std::chrono::steady_clock::time_point last_;
};

}  // namespace kvcache::examples
