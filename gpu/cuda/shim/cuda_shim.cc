/* The shim's runtime: kernel launches on the host (cuda_shim.h says what the
 * kernel sources see), the last-error record, and the check helpers of
 * cuda_impl.h under their shim_* names.
 *
 * A launch runs its blocks one after another on the calling OS thread. Each
 * CUDA thread of the running block is a fiber with its own stack; a fiber
 * runs until it waits (at __syncthreads, a warp shuffle or __syncwarp) or
 * returns, and then hands the OS thread straight to the next fiber that can
 * run, in thread order, round robin. Waiting is a generation count: a
 * barrier's last arrival advances it, and a fiber that waits on an older
 * generation can run again. So the execution is deterministic, has no data
 * races of its own, and costs one stack switch per wait (a few instructions
 * on x86-64; ucontext elsewhere).
 *
 * Errors a GPU would report (a block or grid out of range, dynamic shared
 * memory over the kernel's limit) fail the launch before it runs; what a GPU
 * leaves undefined or hangs on (a full-mask shuffle with a lane that
 * returned or does not exist, threads of a block waiting at different
 * barriers forever) stops it where it is found. Either way the launch's
 * last error names the kernel, and cuda_launch_check reports it. */
#include "gpu/cuda/shim/cuda_shim.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h> /* defines: _mm512_*, _mm256_* (zo_shim_mma16's AVX-512 and AVX2 loops) */
#endif

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

extern "C" {
#include "gpu/cuda/cuda_impl.h" /* defines: shim_status, shim_launch_check (as cuda_*) */
}

#if defined(__SANITIZE_ADDRESS__)
#define ZO_SHIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZO_SHIM_ASAN 1
#endif
#endif
#ifdef ZO_SHIM_ASAN
#include <sanitizer/asan_interface.h>      /* defines: __asan_unpoison_memory_region */
#include <sanitizer/common_interface_defs.h> /* defines: __sanitizer_*_switch_fiber */
#endif

#if defined(__x86_64__) && !defined(ZO_SHIM_UCONTEXT)
#define ZO_SHIM_ASM_SWITCH 1
#else
#include <ucontext.h> /* defines: makecontext, swapcontext (portable, a system call a switch) */
#endif

__thread zo_shim_uint3 zo_shim_threadIdx, zo_shim_blockIdx, zo_shim_blockDim, zo_shim_gridDim;

/* ---- stack switching ------------------------------------------------------------ */

#ifdef ZO_SHIM_ASM_SWITCH
/* zo_shim_switch(&from->sp, to->sp): push the callee-saved registers (System V
 * x86-64: rbp, rbx, r12-r15) on the current stack, save the stack pointer,
 * load the other one and pop its registers. The floating-point control words
 * are left alone: every fiber runs with the launching thread's. A new stack
 * is laid out as if it had switched away in zo_shim_switch, returning into
 * zo_shim_fiber_start, which calls rbx(r12). */
extern "C" void zo_shim_switch(void **save_sp, void *to_sp);
extern "C" void zo_shim_fiber_start(void);
asm(R"(
    .text
    .p2align 4
    .globl zo_shim_switch
    .hidden zo_shim_switch
    .type zo_shim_switch, @function
zo_shim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size zo_shim_switch, .-zo_shim_switch

    .p2align 4
    .globl zo_shim_fiber_start
    .hidden zo_shim_fiber_start
    .type zo_shim_fiber_start, @function
zo_shim_fiber_start:
    movq %r12, %rdi
    callq *%rbx
    ud2
    .size zo_shim_fiber_start, .-zo_shim_fiber_start
)");
#endif

namespace {

struct context {
#ifdef ZO_SHIM_ASM_SWITCH
    void *sp;
#else
    ucontext_t uc;
#endif
};

enum fiber_state : unsigned char { F_READY, F_WAIT_BLOCK, F_WAIT_WARP, F_DONE };

struct fiber {
    context ctx;
    zo_shim_uint3 tid;
    unsigned warp, lane;
    fiber_state state;
    unsigned wait_gen; /* the barrier generation it waits to see pass */
    char *stack_lo;
    void *asan_fake; /* ASan's fake stack while switched out */
};

struct warp_state {
    unsigned size;    /* threads of the block in this warp (32 but in a last partial one) */
    unsigned arrived; /* at the current warp barrier */
    unsigned exited;  /* lanes that returned */
    unsigned gen;
    int kind;               /* what the current barrier's first arrival does */
    unsigned long long slot[2][32]; /* values in flight, by generation parity */
};

/* Per OS thread: the stacks, the running launch and block, the last error. */
struct runtime {
    /* stacks: one mapping, each stack above a PROT_NONE guard page */
    char *map = nullptr;
    size_t map_bytes = 0, stack_bytes = 0, page = 0;
    unsigned n_stacks = 0;

    std::vector<fiber> fibers;
    std::vector<warp_state> warps;
    context main_ctx;
    context dead; /* where a fiber that never resumes leaves its registers */
    void *main_fake = nullptr;
    const void *main_lo = nullptr; /* the launching thread's stack, for ASan */
    size_t main_size = 0;
    bool from_main = false;

    /* the launch */
    bool in_launch = false;
    const char *kernel = nullptr;
    zo_shim::body_fn body = nullptr;
    void *arg = nullptr;
    void *smem = nullptr;
    size_t smem_bytes = 0;

    /* the block */
    unsigned n = 0, live = 0, done = 0, arrived = 0, gen = 0, cur = 0;

    /* a launch stopped while running */
    bool failed = false;
    cudaError_t fail_code = cudaSuccess;
    char fail_msg[512];

    /* the last error (cudaGetLastError) and what the shim knows of it */
    cudaError_t last = cudaSuccess;
    char last_detail[512];

    ~runtime()
    {
        if (map) munmap(map, map_bytes);
    }
};

thread_local std::unique_ptr<runtime> rt_owner;
__thread runtime *rt_cur; /* rt_owner's, without the thread_local wrapper on hot paths */

runtime &rt()
{
    if (!rt_cur) {
        rt_owner.reset(new runtime());
        rt_cur = rt_owner.get();
    }
    return *rt_cur;
}

#ifdef ZO_SHIM_ASAN
const size_t STACK_BYTES = 256u << 10; /* instrumented frames are several times larger */
#else
const size_t STACK_BYTES = 64u << 10;
#endif
/* Fiber i starts (i % 64) * 64 bytes below its stack's top, in room added
 * above STACK_BYTES: the stacks are a whole number of pages apart, so
 * without it every fiber's frames would sit at the same offsets within a
 * page, in the same few sets of the data cache, and evict one another at
 * every switch (it took the shim's warp shuffles from about 20 ns to
 * about 8 ns a lane). */
const size_t COLOR_BYTES = 64u * 64u;

/* Dynamic shared memory a kernel may use without cudaFuncSetAttribute, and
 * the most it may be raised to: sm_80's 163 KiB, the smallest of the
 * default architectures (sm_90 allows 227 KiB). */
const size_t SMEM_DEFAULT = 48u << 10;
const size_t SMEM_OPTIN_MAX = 166912;

std::mutex attr_lock;
std::unordered_map<const void *, size_t> &smem_limits() /* kernel -> raised limit */
{
    static std::unordered_map<const void *, size_t> m;
    return m;
}

void set_last(runtime &r, cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void set_last(runtime &r, cudaError_t e, const char *fmt, ...)
{
    r.last = e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.last_detail, sizeof r.last_detail, fmt, ap);
    va_end(ap);
}

/* Room for n stacks; only between launches (no fiber lives on them). */
bool ensure_stacks(runtime &r, unsigned n)
{
    if (r.n_stacks >= n) return true;
    const size_t page = r.page ? r.page : (r.page = (size_t)sysconf(_SC_PAGESIZE));
    const size_t slot = STACK_BYTES + COLOR_BYTES + page;
    if (r.map) munmap(r.map, r.map_bytes);
    r.map = nullptr;
    r.n_stacks = 0;
    size_t bytes = slot * n;
    void *m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) return false;
#ifdef ZO_SHIM_ASAN
    /* the addresses may have held stacks whose frames never returned */
    __asan_unpoison_memory_region(m, bytes);
#endif
    r.map = static_cast<char *>(m);
    r.map_bytes = bytes;
    r.stack_bytes = STACK_BYTES + COLOR_BYTES;
    for (unsigned i = 0; i < n; i++) /* overflow faults instead of corrupting the next stack */
        if (mprotect(r.map + slot * i, page, PROT_NONE) != 0) return false;
    r.n_stacks = n;
    return true;
}

char *stack_lo(runtime &r, unsigned i) { return r.map + (r.stack_bytes + r.page) * i + r.page; }

/* Save the current context into `from` and resume `to` (whose stack is
 * to_lo..+to_size); from_fake NULL when the current fiber never resumes. */
inline void transfer(context *from, void **from_fake, context *to, const void *to_lo,
                     size_t to_size)
{
#ifdef ZO_SHIM_ASAN
    __sanitizer_start_switch_fiber(from_fake, to_lo, to_size);
#else
    (void)from_fake;
    (void)to_lo;
    (void)to_size;
#endif
#ifdef ZO_SHIM_ASM_SWITCH
    zo_shim_switch(&from->sp, to->sp);
#else
    swapcontext(&from->uc, &to->uc);
#endif
#ifdef ZO_SHIM_ASAN
    if (from_fake) __sanitizer_finish_switch_fiber(*from_fake, nullptr, nullptr);
#endif
}

[[noreturn]] void fiber_main(void *p);

#ifndef ZO_SHIM_ASM_SWITCH
void fiber_entry_uc(unsigned hi, unsigned lo)
{
    fiber_main(reinterpret_cast<void *>(((uintptr_t)hi << 32) | (uintptr_t)lo));
}
#endif

/* Lay out fiber f (the block's thread i) so that switching to it starts
 * fiber_main, COLOR_BYTES's offset below its stack's top. */
void fiber_prepare(runtime &r, fiber &f, unsigned i)
{
    const size_t color = (size_t)(i % (COLOR_BYTES / 64)) * 64;
#ifdef ZO_SHIM_ASM_SWITCH
    void **top = reinterpret_cast<void **>(f.stack_lo + r.stack_bytes - color); /* 16-byte aligned */
    top[-1] = reinterpret_cast<void *>(&zo_shim_fiber_start);           /* ret */
    top[-2] = nullptr;                                                  /* rbp */
    top[-3] = reinterpret_cast<void *>(&fiber_main);                    /* rbx: the entry */
    top[-4] = &r;                                                       /* r12: its argument */
    top[-5] = top[-6] = top[-7] = nullptr;                              /* r13, r14, r15 */
    f.ctx.sp = top - 7;
#else
    getcontext(&f.ctx.uc);
    f.ctx.uc.uc_stack.ss_sp = f.stack_lo;
    f.ctx.uc.uc_stack.ss_size = r.stack_bytes - color;
    f.ctx.uc.uc_link = nullptr;
    uintptr_t p = reinterpret_cast<uintptr_t>(&r);
    makecontext(&f.ctx.uc, reinterpret_cast<void (*)()>(&fiber_entry_uc), 2,
                (unsigned)(p >> 32), (unsigned)(p & 0xffffffffu));
#endif
}

/* Resume the next fiber that can run after the current one, round robin
 * from it (itself last); NULL when none can. Inlined, as wait_here, in
 * every build: the sanitizer build's -O2 called both at every wait. */
inline __attribute__((always_inline)) fiber *pick_next(runtime &r)
{
    const unsigned n = r.n;
    unsigned i = r.cur;
    for (unsigned k = 0; k < n; k++) {
        if (++i == n) i = 0;
        fiber &f = r.fibers[i];
        switch (f.state) {
        case F_READY: return &f;
        case F_WAIT_BLOCK:
            if (f.wait_gen != r.gen) {
                f.state = F_READY;
                return &f;
            }
            break;
        case F_WAIT_WARP:
            if (f.wait_gen != r.warps[f.warp].gen) {
                f.state = F_READY;
                return &f;
            }
            break;
        case F_DONE: break;
        }
    }
    return nullptr;
}

/* Switch from the current fiber to `to` (from_dies: it never resumes). */
inline void switch_fiber(runtime &r, fiber &from, fiber &to, bool from_dies)
{
    r.cur = (unsigned)(&to - r.fibers.data());
    zo_shim_threadIdx = to.tid;
    transfer(from_dies ? &r.dead : &from.ctx, from_dies ? nullptr : &from.asan_fake, &to.ctx,
             to.stack_lo, r.stack_bytes);
}

[[noreturn]] void to_main(runtime &r)
{
    transfer(&r.dead, nullptr, &r.main_ctx, r.main_lo, r.main_size);
    __builtin_unreachable();
}

/* Stop the launch here: record why (the first reason wins) and go back to
 * the launching thread; no fiber of the block runs again. */
[[noreturn]] void fail(runtime &r, cudaError_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
[[noreturn]] void fail(runtime &r, cudaError_t code, const char *fmt, ...)
{
    if (!r.failed) {
        r.failed = true;
        r.fail_code = code;
        int k = snprintf(r.fail_msg, sizeof r.fail_msg, "%s, block (%u, %u, %u): ", r.kernel,
                         zo_shim_blockIdx.x, zo_shim_blockIdx.y, zo_shim_blockIdx.z);
        if (k < 0 || (size_t)k >= sizeof r.fail_msg) k = 0;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r.fail_msg + k, sizeof r.fail_msg - (size_t)k, fmt, ap);
        va_end(ap);
    }
    to_main(r);
}

[[noreturn]] void fail_deadlock(runtime &r)
{
    unsigned at_block = 0, at_warp = 0;
    for (unsigned i = 0; i < r.n; i++) {
        at_block += r.fibers[i].state == F_WAIT_BLOCK;
        at_warp += r.fibers[i].state == F_WAIT_WARP;
    }
    fail(r, cudaErrorLaunchFailure,
         "deadlock: %u threads wait at __syncthreads, %u at a warp shuffle or __syncwarp, %u "
         "returned (every live thread of a block must reach the same barrier)",
         at_block, at_warp, r.done);
}

/* The current fiber waits (its state and generation set); run others until
 * it may go on. */
inline __attribute__((always_inline)) void wait_here(runtime &r, fiber &self)
{
    fiber *next = pick_next(r);
    if (!next) fail_deadlock(r);
    if (next == &self) return; /* its barrier passed already (pick_next set it ready) */
    switch_fiber(r, self, *next, false);
}

[[noreturn]] void thread_exit(runtime &r)
{
    fiber &self = r.fibers[r.cur];
    warp_state &w = r.warps[self.warp];
    self.state = F_DONE;
    r.live--;
    r.done++;
    w.exited++;
    if (w.arrived > 0)
        fail(r, cudaErrorIllegalInstruction,
             "thread (%u, %u, %u) returned while %u other lanes of its warp %u wait at a "
             "full-mask warp shuffle or __syncwarp (undefined on a GPU)",
             self.tid.x, self.tid.y, self.tid.z, w.arrived, self.warp);
    if (r.arrived > 0 && r.arrived == r.live) { /* the returned thread was the last one missing */
        r.arrived = 0;
        r.gen++;
    }
    if (r.done == r.n) to_main(r);
    fiber *next = pick_next(r);
    if (!next) fail_deadlock(r);
    switch_fiber(r, self, *next, true);
    __builtin_unreachable();
}

[[noreturn]] void fiber_main(void *p)
{
    runtime &r = *static_cast<runtime *>(p);
#ifdef ZO_SHIM_ASAN
    const void *lo;
    size_t size;
    __sanitizer_finish_switch_fiber(nullptr, &lo, &size);
    if (r.from_main) { /* the stack we came from is the launching thread's */
        r.main_lo = lo;
        r.main_size = size;
    }
#endif
    r.from_main = false;
    r.body(r.arg);
    thread_exit(r);
}

/* Run block blockIdx of the launch: every thread from its start until all
 * returned, or the launch failed. */
void run_block(runtime &r)
{
    const zo_shim_uint3 bd = zo_shim_blockDim;
    r.live = r.n;
    r.done = r.arrived = r.gen = 0;
    for (warp_state &w : r.warps) {
        w.arrived = w.exited = w.gen = 0;
        w.kind = -1;
    }
    /* uninitialised on a GPU: all-ones bytes (nan as floats) expose reads before writes */
    if (r.smem_bytes) memset(r.smem, 0xff, r.smem_bytes);
    for (unsigned i = 0; i < r.n; i++) {
        fiber &f = r.fibers[i];
        f.tid = {i % bd.x, i / bd.x % bd.y, i / (bd.x * bd.y)};
        f.warp = i / 32;
        f.lane = i % 32;
        f.state = F_READY;
        f.wait_gen = 0;
        f.stack_lo = stack_lo(r, i);
        f.asan_fake = nullptr;
        fiber_prepare(r, f, i);
    }
    r.cur = 0;
    zo_shim_threadIdx = r.fibers[0].tid;
    r.from_main = true;
    transfer(&r.main_ctx, &r.main_fake, &r.fibers[0].ctx, r.fibers[0].stack_lo, r.stack_bytes);
}

} // namespace

/* ---- launches ------------------------------------------------------------------ */

void zo_shim::launch(const char *name, const void *kernel, zo_shim_dim3 grid, zo_shim_dim3 block,
                     size_t smem, body_fn body, void *arg)
{
    runtime &r = rt();
    if (r.in_launch) { /* no dynamic parallelism: a kernel body does not launch */
        set_last(r, cudaErrorLaunchFailure, "%s: launched from inside the kernel %s", name,
                 r.kernel);
        return;
    }
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!block.x || !block.y || !block.z || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        threads > 1024) {
        set_last(r, cudaErrorInvalidConfiguration,
                 "%s: blockDim (%u, %u, %u) is %llu threads; a block takes 1 to 1024 (x, y at "
                 "most 1024, z at most 64)",
                 name, block.x, block.y, block.z, threads);
        return;
    }
    if (!grid.x || !grid.y || !grid.z || grid.x > 2147483647u || grid.y > 65535u ||
        grid.z > 65535u) {
        set_last(r, cudaErrorInvalidConfiguration,
                 "%s: gridDim (%u, %u, %u) out of range (x 1 to 2^31-1, y and z 1 to 65535)",
                 name, grid.x, grid.y, grid.z);
        return;
    }
    size_t limit = SMEM_DEFAULT;
    {
        std::lock_guard<std::mutex> g(attr_lock);
        auto it = smem_limits().find(kernel);
        if (it != smem_limits().end()) limit = it->second;
    }
    if (smem > limit) {
        set_last(r, cudaErrorInvalidValue,
                 "%s: %zu bytes of dynamic shared memory, over the kernel's limit of %zu (48 KiB "
                 "unless raised with cudaFuncSetAttribute(MaxDynamicSharedMemorySize))",
                 name, smem, limit);
        return;
    }
    const unsigned n = (unsigned)threads;
    if (!ensure_stacks(r, n)) {
        set_last(r, cudaErrorMemoryAllocation, "%s: no host memory for %u fiber stacks", name, n);
        return;
    }
    /* exactly smem bytes: a kernel reading past them is a heap overflow under ASan */
    void *sm = malloc(smem ? smem : 1);
    if (!sm) {
        set_last(r, cudaErrorMemoryAllocation, "%s: no host memory for %zu bytes of shared memory",
                 name, smem);
        return;
    }
    r.fibers.resize(n);
    r.warps.resize((n + 31) / 32);
    for (unsigned w = 0; w < r.warps.size(); w++) r.warps[w].size = n - 32 * w < 32 ? n - 32 * w : 32;
    r.in_launch = true;
    r.kernel = name;
    r.body = body;
    r.arg = arg;
    r.smem = sm;
    r.smem_bytes = smem;
    r.n = n;
    r.failed = false;
    zo_shim_gridDim = {grid.x, grid.y, grid.z};
    zo_shim_blockDim = {block.x, block.y, block.z};
    for (unsigned z = 0; z < grid.z && !r.failed; z++)
        for (unsigned y = 0; y < grid.y && !r.failed; y++)
            for (unsigned x = 0; x < grid.x && !r.failed; x++) {
                zo_shim_blockIdx = {x, y, z};
                run_block(r);
            }
#ifdef ZO_SHIM_ASAN
    /* the stopped block's fibers never unwound: clear their frames' poison */
    if (r.failed) __asan_unpoison_memory_region(r.map, r.map_bytes);
#endif
    free(sm);
    r.smem = nullptr;
    r.in_launch = false;
    r.kernel = nullptr;
    if (r.failed) set_last(r, r.fail_code, "%s", r.fail_msg);
}

/* ---- what the kernels call ------------------------------------------------------ */

/* ---- the stopwatch (cuda_impl.h): the kernels have run when their launch
 * returns, so the host's monotonic clock times them ---------------------------- */

static double shim_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

extern "C" zo_status shim_stopwatch_start(cudaStream_t, cuda_stopwatch *w)
{
    *w = cuda_stopwatch{};
    w->t0 = shim_now_us();
    return ZO_OK;
}

extern "C" zo_status shim_stopwatch_stop(cudaStream_t, cuda_stopwatch *w, double *us)
{
    *us = shim_now_us() - w->t0;
    return ZO_OK;
}

/* The barrier and the warp exchange touch the runtime's own bookkeeping
 * alone (the value exchanged travels in a register), and a warp exchange
 * is 32 fiber switches: ZO_UNCHECKED, 5% of test_ops' attention backward
 * under the sanitizers (53.4 -> 50.6 s). */
extern "C" ZO_UNCHECKED void zo_shim_syncthreads(void)
{
    runtime &r = *rt_cur;
    fiber &self = r.fibers[r.cur];
    if (++r.arrived == r.live) {
        r.arrived = 0;
        r.gen++;
        return;
    }
    self.state = F_WAIT_BLOCK;
    self.wait_gen = r.gen;
    wait_here(r, self);
}

extern "C" void zo_shim_vec_fault(const void *addr)
{
    runtime &r = *rt_cur;
    fiber &self = r.fibers[r.cur];
    fail(r, cudaErrorMisalignedAddress, "thread (%u, %u, %u): 16-byte vector access at %p, off a 16-byte "
         "boundary", self.tid.x, self.tid.y, self.tid.z, addr);
}

static const char *shfl_name(int kind)
{
    switch (kind) {
    case ZO_SHIM_SHFL_IDX: return "__shfl_sync";
    case ZO_SHIM_SHFL_XOR: return "__shfl_xor_sync";
    case ZO_SHIM_SHFL_UP: return "__shfl_up_sync";
    case ZO_SHIM_SHFL_DOWN: return "__shfl_down_sync";
    default: return "__syncwarp";
    }
}

extern "C" ZO_UNCHECKED unsigned long long zo_shim_shfl(unsigned mask, unsigned long long v, int kind, int arg,
                                           int width)
{
    runtime &r = *rt_cur;
    fiber &self = r.fibers[r.cur];
    warp_state &w = r.warps[self.warp];
    if (mask != 0xffffffffu)
        fail(r, cudaErrorIllegalInstruction,
             "thread (%u, %u, %u): %s with mask 0x%08x; the shim runs full-warp masks only",
             self.tid.x, self.tid.y, self.tid.z, shfl_name(kind), mask);
    if (w.size != 32)
        fail(r, cudaErrorIllegalInstruction,
             "thread (%u, %u, %u): full-mask %s in warp %u, which has %u threads (the block's "
             "size is not a multiple of 32)",
             self.tid.x, self.tid.y, self.tid.z, shfl_name(kind), self.warp, w.size);
    if (w.exited)
        fail(r, cudaErrorIllegalInstruction,
             "thread (%u, %u, %u): full-mask %s while %u lanes of its warp %u have returned "
             "(undefined on a GPU)",
             self.tid.x, self.tid.y, self.tid.z, shfl_name(kind), w.exited, self.warp);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail(r, cudaErrorIllegalInstruction, "thread (%u, %u, %u): %s width %d", self.tid.x,
             self.tid.y, self.tid.z, shfl_name(kind), width);
    if (w.arrived == 0) w.kind = kind;
    else if (w.kind != kind) /* lanes at different exchanges: divergent shuffles */
        fail(r, cudaErrorIllegalInstruction,
             "thread (%u, %u, %u): %s while other lanes of warp %u are at %s (divergent warp "
             "exchange)",
             self.tid.x, self.tid.y, self.tid.z, shfl_name(kind), self.warp, shfl_name(w.kind));
    const unsigned phase = w.gen & 1u, lane = self.lane;
    w.slot[phase][lane] = v;
    if (++w.arrived == 32) {
        w.arrived = 0;
        w.gen++;
    } else {
        self.state = F_WAIT_WARP;
        self.wait_gen = w.gen;
        wait_here(r, self);
    }
    /* the source lane within this lane's segment of `width` lanes; out of the
     * segment, a lane gets its own value */
    const unsigned seg = lane & ~(unsigned)(width - 1);
    unsigned src = lane;
    switch (kind) {
    case ZO_SHIM_SHFL_IDX: src = seg + ((unsigned)arg & (unsigned)(width - 1)); break;
    case ZO_SHIM_SHFL_XOR: src = lane ^ (unsigned)arg; break;
    case ZO_SHIM_SHFL_UP: src = lane - (unsigned)arg; break;
    case ZO_SHIM_SHFL_DOWN: src = lane + (unsigned)arg; break;
    default: return 0;
    }
    if (src < seg || src >= seg + (unsigned)width) src = lane;
    return w.slot[phase][src];
}

extern "C" void *zo_shim_dynamic_smem(void) { return rt_cur->smem; }

/* zo_shim_mma16's loops, compiled for each vector width (below): the loop
 * over n vectorizes (gcc vectorizes the outer loop), every sum keeps its
 * order, and -ffp-contract=off keeps each product and sum one rounding. */
#define ZO_SHIM_MMA16_BODY                                                                         \
    for (int r = 0; r < 16; r++)                                                                   \
        for (int n = 0; n < 16; n++) {                                                             \
            float s = c[r * 16 + n];                                                               \
            for (int k = 0; k < 16; k++) s += a[r * 16 + k] * b[k * 16 + n];                      \
            out[r * 16 + n] = s;                                                                   \
        }

#if defined(__x86_64__) && defined(__GNUC__)
/* Eight rows at a time, so eight chains of additions overlap; b's 16 rows
 * held in registers. */
__attribute__((target("avx512f"))) ZO_UNCHECKED static void mma16_avx512(float *__restrict out,
                                                                       const float *__restrict a,
                                                                       const float *__restrict b,
                                                                       const float *__restrict c)
{
    __m512 bk[16];
    for (int k = 0; k < 16; k++) bk[k] = _mm512_loadu_ps(b + k * 16);
    for (int r = 0; r < 16; r += 8) {
        __m512 s[8];
        for (int i = 0; i < 8; i++) s[i] = _mm512_loadu_ps(c + (r + i) * 16);
        for (int k = 0; k < 16; k++)
            for (int i = 0; i < 8; i++)
                s[i] = _mm512_add_ps(s[i], _mm512_mul_ps(_mm512_set1_ps(a[(r + i) * 16 + k]), bk[k]));
        for (int i = 0; i < 8; i++) _mm512_storeu_ps(out + (r + i) * 16, s[i]);
    }
}

/* Without AVX-512 (AVX2 machines): four rows at a time, each row's 16
 * columns two vectors of 8, b's rows read from L1 (16 registers hold
 * only part of them); the same products and sums in the same order, each
 * one rounding (a multiply, then an add: no FMA). */
__attribute__((target("avx2"))) ZO_UNCHECKED static void mma16_avx2(float *__restrict out,
                                                                   const float *__restrict a,
                                                                   const float *__restrict b,
                                                                   const float *__restrict c)
{
    for (int r = 0; r < 16; r += 4) {
        __m256 s[4][2];
        for (int i = 0; i < 4; i++) {
            s[i][0] = _mm256_loadu_ps(c + (r + i) * 16);
            s[i][1] = _mm256_loadu_ps(c + (r + i) * 16 + 8);
        }
        for (int k = 0; k < 16; k++) {
            const __m256 b0 = _mm256_loadu_ps(b + k * 16), b1 = _mm256_loadu_ps(b + k * 16 + 8);
            for (int i = 0; i < 4; i++) {
                const __m256 x = _mm256_set1_ps(a[(r + i) * 16 + k]);
                s[i][0] = _mm256_add_ps(s[i][0], _mm256_mul_ps(x, b0));
                s[i][1] = _mm256_add_ps(s[i][1], _mm256_mul_ps(x, b1));
            }
        }
        for (int i = 0; i < 4; i++) {
            _mm256_storeu_ps(out + (r + i) * 16, s[i][0]);
            _mm256_storeu_ps(out + (r + i) * 16 + 8, s[i][1]);
        }
    }
}
#endif

ZO_UNCHECKED static void mma16_plain(float *__restrict out, const float *__restrict a,
                                     const float *__restrict b, const float *__restrict c)
{
    ZO_SHIM_MMA16_BODY
}

/* The shim's arithmetic on its own copies (ZO_UNCHECKED): a tensor-core
 * kernel's fragments, each lane's whole tile. It was most of the
 * tensor-core kernels' time on the shim, every lane of a warp redoing it. */
extern "C" ZO_UNCHECKED void zo_shim_mma16(float *out, const float *a, const float *b, const float *c)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f")) {
        mma16_avx512(out, a, b, c);
        return;
    }
    if (__builtin_cpu_supports("avx2")) {
        mma16_avx2(out, a, b, c);
        return;
    }
#endif
    mma16_plain(out, a, b, c);
}

/* ---- the tensor cores' accumulation (ZO_SHIM_TC_ACCUM) --------------------------
 * Off (unset, or "ieee"): every product and sum one IEEE fp32 operation,
 * k = 0 .. 15 in order. "rz[:B[:G]]": the published model of NVIDIA's
 * tensor cores with 16-bit operands and an fp32 accumulator (Fasi, Higham,
 * Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS
 * 2021; Khattak, Mikaitis, "Accurate models of NVIDIA tensor cores", 2025):
 * the k products in blocks of B, each block with the accumulator c in one
 * step: the products exact, every addend aligned to the largest exponent of
 * the step and truncated (toward zero) below G bits past fp32's 24, summed
 * exactly, the sum truncated to 24 significant bits (round toward zero).
 * B 16 and G 2 unless given: the values an H100 gave for test_ops'
 * attention backward (docs/testing.md). */
static int tc_block = -1, tc_guard = 2;

static void tc_accum_init(void)
{
    const char *e = getenv("ZO_SHIM_TC_ACCUM");
    int b = 0, g = 2;
    if (e && strncmp(e, "rz", 2) == 0) {
        b = 16;
        if (e[2] == ':') sscanf(e + 3, "%d:%d", &b, &g);
        if (b < 1 || b > 16 || 16 % b != 0 || g < 0 || g > 20) {
            fprintf(stderr, "ZO_SHIM_TC_ACCUM=%s: expected rz[:B[:G]] with B 1, 2, 4, 8 or 16, G 0 .. 20\n", e);
            abort();
        }
    } else if (e && *e && strcmp(e, "ieee") != 0) {
        fprintf(stderr, "ZO_SHIM_TC_ACCUM=%s: expected ieee or rz[:B[:G]]\n", e);
        abort();
    }
    tc_guard = g;
    __atomic_store_n(&tc_block, b, __ATOMIC_RELEASE);
}

extern "C" void zo_shim_tc_accum_set(int block, int guard)
{
    tc_guard = guard;
    __atomic_store_n(&tc_block, block, __ATOMIC_RELEASE);
}

extern "C" int zo_shim_tc_block(void)
{
    int b = __atomic_load_n(&tc_block, __ATOMIC_ACQUIRE);
    if (b < 0) {
        static std::once_flag once;
        std::call_once(once, tc_accum_init);
        b = __atomic_load_n(&tc_block, __ATOMIC_ACQUIRE);
    }
    return b;
}

/* x truncated toward zero to a multiple of q (a power of two; r = 1 / q) */
static inline double tc_trunc(double x, double q, double r) { return trunc(x * r) * q; }

/* One step of the model: c plus n exact products p */
static float tc_step(float c, const double *p, int n)
{
    double mx = fabs((double)c);
    for (int i = 0; i < n; i++) mx = fabs(p[i]) > mx ? fabs(p[i]) : mx;
    if (mx == 0.0 || !isfinite(mx)) {
        double s = c;
        for (int i = 0; i < n; i++) s += p[i];
        return (float)s;
    }
    int e;
    frexp(mx, &e); /* the largest addend's leading bit is 2^(e-1), its fp32 unit 2^(e-24) */
    const double q = ldexp(1.0, e - 24 - tc_guard), r = ldexp(1.0, 24 + tc_guard - e);
    double s = tc_trunc(c, q, r); /* every addend a multiple of q below 2^e: the sum is exact */
    for (int i = 0; i < n; i++) s += tc_trunc(p[i], q, r);
    if (s == 0.0) return 0.0f;
    int es;
    frexp(s, &es);
    return (float)tc_trunc(s, ldexp(1.0, es - 24), ldexp(1.0, 24 - es));
}

extern "C" float zo_shim_tc_dot16(float c, const float *a, const float *b, int ldb)
{
    const int blk = zo_shim_tc_block();
    if (blk == 0) {
        for (int k = 0; k < 16; k++) c += a[k] * b[(size_t)k * ldb];
        return c;
    }
    double p[16];
    for (int k = 0; k < 16; k++) p[k] = (double)a[k] * b[(size_t)k * ldb];
    for (int k = 0; k < 16; k += blk) c = tc_step(c, p + k, blk);
    return c;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* 256 16-bit values to fp32, 8 at a time: bf16 by a shift into the high
 * half, fp16 by F16C's conversion (exact, as zo_f16_to_f32, subnormals
 * too; a signalling NaN comes out quiet). The scalar fp16 conversion was most of the 16-bit tensor-core
 * kernels' time on the shim where AVX-512 is missing. */
__attribute__((target("avx2,f16c"))) ZO_UNCHECKED static void cvt16_avx2(float *__restrict dst,
                                                                        const uint16_t *__restrict src,
                                                                        int bf16)
{
    for (int i = 0; i < 256; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i));
        const __m256 f = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                              : _mm256_cvtph_ps(h);
        _mm256_storeu_ps(dst + i, f);
    }
}
#endif

/* flatten: the conversions inlined in every build (the sanitizer build's
 * -O2 called a function an element). */
extern "C" ZO_UNCHECKED __attribute__((flatten)) void zo_shim_mma16_16(float *d, const uint16_t *a,
                                                                        const uint16_t *b, const float *c,
                                                                        int bf16)
{
    float fa[256], fb[256], out[256];
#if defined(__x86_64__) && defined(__GNUC__)
    static const int f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    if (f16c) {
        cvt16_avx2(fa, a, bf16);
        cvt16_avx2(fb, b, bf16);
    } else
#endif
    if (bf16)
        for (int i = 0; i < 256; i++) fa[i] = zo_bf16_to_f32(a[i]), fb[i] = zo_bf16_to_f32(b[i]);
    else
        for (int i = 0; i < 256; i++) fa[i] = zo_f16_to_f32(a[i]), fb[i] = zo_f16_to_f32(b[i]);
    if (zo_shim_tc_block() > 0) /* the hardware's accumulation (ZO_SHIM_TC_ACCUM) */
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 16; n++) out[r * 16 + n] = zo_shim_tc_dot16(c[r * 16 + n], fa + r * 16, fb + n, 16);
    else zo_shim_mma16(out, fa, fb, c);
    memcpy(d, out, sizeof out);
}

/* ---- the runtime API ------------------------------------------------------------ */

extern "C" cudaError_t zo_shim_take_last_error(int clear, char *detail, size_t cap)
{
    runtime &r = rt();
    cudaError_t e = r.last;
    if (detail && cap) snprintf(detail, cap, "%s", e != cudaSuccess ? r.last_detail : "");
    if (clear) {
        r.last = cudaSuccess;
        r.last_detail[0] = '\0';
    }
    return e;
}

extern "C" cudaError_t zo_shim_func_set_attribute(const void *kernel, cudaFuncAttribute attr,
                                                  int value)
{
    runtime &r = rt();
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
        set_last(r, cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d is not kept by the "
                                           "shim", (int)attr);
        return cudaErrorInvalidValue;
    }
    if (value < 0 || (size_t)value > SMEM_OPTIN_MAX) {
        set_last(r, cudaErrorInvalidValue,
                 "cudaFuncSetAttribute(MaxDynamicSharedMemorySize, %d): more than the %zu bytes "
                 "a block may have (sm_80)",
                 value, SMEM_OPTIN_MAX);
        return cudaErrorInvalidValue;
    }
    std::lock_guard<std::mutex> g(attr_lock);
    smem_limits()[kernel] = (size_t)value;
    return cudaSuccess;
}

extern "C" cudaError_t zo_shim_memcpy(void *dst, const void *src, size_t bytes)
{
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (bytes && d < s + bytes && s < d + bytes) {
        set_last(rt(), cudaErrorInvalidValue,
                 "cudaMemcpyAsync: source and destination overlap (%zu bytes)", bytes);
        return cudaErrorInvalidValue;
    }
    if (bytes) memcpy(dst, src, bytes);
    return cudaSuccess;
}

/* The pool: the size of each block it gave out kept beside it (a table,
 * not a header before the block, so that ASan still sees a write before
 * the block's start), the bytes held and the most held since the last
 * reset counted over every thread. */
namespace {
std::mutex pool_lock;
std::unordered_map<void *, size_t> pool_blocks;
size_t pool_held = 0, pool_peak = 0;
} // namespace

extern "C" cudaError_t zo_shim_malloc(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    if (!*p) {
        set_last(rt(), cudaErrorMemoryAllocation, "cudaMallocFromPoolAsync: %zu bytes of host memory", bytes);
        return cudaErrorMemoryAllocation;
    }
    memset(*p, 0xff, bytes);
    std::lock_guard<std::mutex> g(pool_lock);
    pool_blocks[*p] = bytes;
    pool_held += bytes;
    if (pool_held > pool_peak) pool_peak = pool_held;
    return cudaSuccess;
}

extern "C" void zo_shim_free(void *p)
{
    if (!p) return;
    {
        std::lock_guard<std::mutex> g(pool_lock);
        auto it = pool_blocks.find(p);
        if (it != pool_blocks.end()) {
            pool_held -= it->second;
            pool_blocks.erase(it);
        }
    }
    free(p);
}

extern "C" size_t zo_shim_pool_held(void)
{
    std::lock_guard<std::mutex> g(pool_lock);
    return pool_held;
}

extern "C" size_t zo_shim_pool_peak(void)
{
    std::lock_guard<std::mutex> g(pool_lock);
    return pool_peak;
}

extern "C" void zo_shim_pool_reset_peak(void)
{
    std::lock_guard<std::mutex> g(pool_lock);
    pool_peak = pool_held;
}

extern "C" const char *zo_shim_error_string(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorIllegalInstruction: return "an illegal instruction was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    }
    return "unknown error";
}

extern "C" const char *zo_shim_error_name(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorIllegalInstruction: return "cudaErrorIllegalInstruction";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

/* ---- cuda_impl.h's check helpers, as device_cuda.c's, plus the shim's detail --- */

extern "C" zo_status cuda_status(cudaError_t e, const char *call)
{
    if (e == cudaSuccess) return ZO_OK;
    char detail[512];
    (void)zo_shim_take_last_error(1, detail, sizeof detail);
    zo_status s = e == cudaErrorMemoryAllocation ? ZO_ERR_CAPACITY : ZO_ERR_DEVICE;
    return zo_error(s, "%s: %s (%s)%s%s", call, zo_shim_error_string(e), zo_shim_error_name(e),
                    detail[0] ? ": " : "", detail);
}

extern "C" zo_status cuda_launch_check(const char *kernel)
{
    char detail[512];
    cudaError_t e = zo_shim_take_last_error(1, detail, sizeof detail);
    if (e == cudaSuccess) return ZO_OK;
    return zo_error(ZO_ERR_DEVICE, "launch of %s: %s (%s)%s%s", kernel, zo_shim_error_string(e),
                    zo_shim_error_name(e), detail[0] ? ": " : "", detail);
}
