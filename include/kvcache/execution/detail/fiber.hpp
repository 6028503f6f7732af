// Fibers for the SIMT emulator: stacks, a context switch and the
// AddressSanitizer annotations that keep ASan aware of which stack is live.
//
// On x86-64 with GCC or Clang a few instructions switch stacks (callee-saved
// registers, MXCSR and the x87 control word); elsewhere ucontext is used,
// whose swapcontext costs a sigprocmask system call per switch.
#pragma once

// Seen by tests/hygiene: the umbrella header must not bring fibers in.
#define KVCACHE_DETAIL_FIBERS_INCLUDED 1

#include <cstddef>
#include <cstdint>
#include <new>

#include <sys/mman.h>
#include <unistd.h>

#include "kvcache/core/error.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(KVCACHE_EMULATOR_USE_UCONTEXT)
#define KVCACHE_EMULATOR_ASM_SWITCH 1
#else
#define KVCACHE_EMULATOR_ASM_SWITCH 0
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define KVCACHE_EMULATOR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVCACHE_EMULATOR_ASAN 1
#endif
#endif
#ifndef KVCACHE_EMULATOR_ASAN
#define KVCACHE_EMULATOR_ASAN 0
#endif

#if KVCACHE_EMULATOR_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace kvcache::detail {

/// The saved machine state of a suspended fiber (or of the scheduler).
struct machine_context {
#if KVCACHE_EMULATOR_ASM_SWITCH
    void* stack_pointer = nullptr;  ///< everything else lives on the suspended stack
#else
    ucontext_t context{};
#endif
};

#if KVCACHE_EMULATOR_ASM_SWITCH
/// Saves the callee-saved state of the caller on its stack, stores the stack
/// pointer in *save, loads `load` and returns into the fiber found there.
/// Naked: the compiler adds no prologue, so the stack layout is exactly ours;
/// noipa: GCC must not conclude from the body that caller-saved registers survive.
#if defined(__clang__)
#define KVCACHE_EMULATOR_SWITCH_ATTRIBUTES __attribute__((naked, noinline))
#else
#define KVCACHE_EMULATOR_SWITCH_ATTRIBUTES __attribute__((naked, noinline, noipa))
#endif
KVCACHE_EMULATOR_SWITCH_ATTRIBUTES inline void switch_stack(void** /*save*/, void* /*load*/) {
    asm volatile(
        "pushq %rbp\n\t"
        "pushq %rbx\n\t"
        "pushq %r12\n\t"
        "pushq %r13\n\t"
        "pushq %r14\n\t"
        "pushq %r15\n\t"
        "subq $8, %rsp\n\t"
        "stmxcsr (%rsp)\n\t"
        "fnstcw 4(%rsp)\n\t"
        "movq %rsp, (%rdi)\n\t"
        "movq %rsi, %rsp\n\t"
        "ldmxcsr (%rsp)\n\t"
        "fldcw 4(%rsp)\n\t"
        "addq $8, %rsp\n\t"
        "popq %r15\n\t"
        "popq %r14\n\t"
        "popq %r13\n\t"
        "popq %r12\n\t"
        "popq %rbx\n\t"
        "popq %rbp\n\t"
        "ret\n\t");
}
#endif

/// Makes `context` start `entry` on [bottom, bottom + size) when first switched to.
/// `entry` must never return (it switches away for the last time instead).
inline void prepare_context(machine_context& context, char* bottom, std::size_t size, void (*entry)()) {
#if KVCACHE_EMULATOR_ASM_SWITCH
    auto top = reinterpret_cast<std::uintptr_t>(bottom + size) & ~std::uintptr_t{15};
    auto* slot = reinterpret_cast<std::uint64_t*>(top);
    *--slot = 0;                                          // entry's return address: none
    *--slot = reinterpret_cast<std::uint64_t>(entry);     // popped by `ret`
    for (int i = 0; i < 6; ++i) *--slot = 0;              // rbp rbx r12 r13 r14 r15
    *--slot = 0x1f80u | (std::uint64_t{0x037fu} << 32);   // default MXCSR and x87 control word
    context.stack_pointer = slot;
#else
    if (getcontext(&context.context) != 0) throw_error(error_code::out_of_memory, "getcontext failed");
    context.context.uc_stack.ss_sp = bottom;
    context.context.uc_stack.ss_size = size;
    context.context.uc_link = nullptr;
    makecontext(&context.context, entry, 0);
#endif
}

/// Suspends the caller into `from` and resumes `to`.
inline void switch_context(machine_context& from, machine_context& to) {
#if KVCACHE_EMULATOR_ASM_SWITCH
    switch_stack(&from.stack_pointer, to.stack_pointer);
#else
    swapcontext(&from.context, &to.context);
#endif
}

/// Tell ASan the running stack is about to change (fake_stack_save == nullptr:
/// the current fiber is finished and its fake stack may be freed).
inline void asan_start_switch([[maybe_unused]] void** fake_stack_save, [[maybe_unused]] const void* bottom,
                              [[maybe_unused]] std::size_t size) {
#if KVCACHE_EMULATOR_ASAN
    __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
#endif
}

/// Tell ASan the switch has happened; reports the stack that was left.
inline void asan_finish_switch([[maybe_unused]] void* fake_stack_save, [[maybe_unused]] const void** old_bottom,
                               [[maybe_unused]] std::size_t* old_size) {
#if KVCACHE_EMULATOR_ASAN
    __sanitizer_finish_switch_fiber(fake_stack_save, old_bottom, old_size);
#endif
}

/// Forget stale ASan stack poisoning before a stack is reused by a new fiber.
inline void asan_unpoison_stack([[maybe_unused]] char* bottom, [[maybe_unused]] std::size_t size) {
#if KVCACHE_EMULATOR_ASAN
    __asan_unpoison_memory_region(bottom, size);
#endif
}

/// Fiber stacks, each with a guard page below it so an overflow faults instead
/// of corrupting a neighbour. Kept per OS thread and reused by every later
/// emulated launch with the same stack size, so launches pay no mmap.
class stack_pool {
public:
    stack_pool() = default;
    stack_pool(const stack_pool&) = delete;
    stack_pool& operator=(const stack_pool&) = delete;
    ~stack_pool() { release(); }

    /// Ensures at least `count` stacks of at least `bytes` usable bytes each.
    void reserve(int count, std::size_t bytes) {
        const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
        const std::size_t rounded = (bytes + page - 1) / page * page;
        if (count <= count_ && rounded <= stack_bytes_) return;  // larger stacks serve smaller requests
        release();
        const std::size_t stride = rounded + page;
        void* memory = mmap(nullptr, stride * static_cast<std::size_t>(count), PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (memory == MAP_FAILED)
            throw_error(error_code::out_of_memory, "emulator stacks: ", count, " x ", rounded, " bytes");
        base_ = static_cast<char*>(memory);
        for (int i = 0; i < count; ++i) mprotect(base_ + stride * static_cast<std::size_t>(i), page, PROT_NONE);
        count_ = count;
        stack_bytes_ = rounded;
        stride_ = stride;
        page_ = page;
    }

    /// The lowest usable address of stack i.
    char* bottom(int i) const noexcept { return base_ + stride_ * static_cast<std::size_t>(i) + page_; }
    /// Usable bytes of each stack.
    std::size_t stack_bytes() const noexcept { return stack_bytes_; }

private:
    void release() noexcept {
        if (base_ != nullptr) munmap(base_, stride_ * static_cast<std::size_t>(count_));
        base_ = nullptr;
        count_ = 0;
    }

    char* base_ = nullptr;
    int count_ = 0;
    std::size_t stack_bytes_ = 0;
    std::size_t stride_ = 0;
    std::size_t page_ = 0;
};

/// This OS thread's stack pool.
inline stack_pool& thread_stack_pool() {
    static thread_local stack_pool pool;
    return pool;
}

}  // namespace kvcache::detail
