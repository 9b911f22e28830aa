"""The C++ that labkit.cudacpu compiles beside a kernel, kept as Python strings so that it travels wherever the
package's modules do (the grader's private copy of labkit takes its .py files only).

HEADER is force-included (``-include``) before a kernel's source: the CUDA built-ins the kit's kernels use.
LAUNCHER is a translation unit of its own, linked into every kernel's library: blocks, threads, the barrier.
TRAMPOLINES follow the kernel's source: per ``__global__`` kernel, its parameters' kinds and a call from Python.
"""

HEADER = r"""// The CUDA built-ins the kit's kernels use, for a CPU: force-included (-include) before a CUDA C source that
// labkit.cudacpu compiles as C++ for this machine. Each CUDA thread of a block runs as a cooperative thread
// (LAUNCHER) that gives way only at __syncthreads(); threadIdx is set for it whenever it resumes. A kernel's
// -D options may define any short name as a macro: every name of this file is CUDA's own or starts with cudacpu.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
};

extern "C" {
// the thread that is running, its block, the launch's shapes: written by the launcher before each switch
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;
void cudacpu_syncthreads(void);
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
// a plain global: dlsym finds it by name (get_global), its size comes from the symbol table
#define __constant__ __attribute__((visibility("default"), used))
// static storage in one section the launcher fills with NaN before each block; "used" keeps the compiler from
// assuming that the other threads (entered through an opaque context switch) cannot change it
#define __shared__ static __attribute__((section("cudacpu_shared"), used))
#define __syncthreads() cudacpu_syncthreads()
#define warpSize 32

template <typename cudacpu_T> static __forceinline__ cudacpu_T __ldg(const cudacpu_T* cudacpu_p) { return *cudacpu_p; }
static __forceinline__ int min(int cudacpu_a, int cudacpu_b) { return cudacpu_a < cudacpu_b ? cudacpu_a : cudacpu_b; }
static __forceinline__ int max(int cudacpu_a, int cudacpu_b) { return cudacpu_a > cudacpu_b ? cudacpu_a : cudacpu_b; }
static __forceinline__ float __fdividef(float cudacpu_a, float cudacpu_b) { return cudacpu_a / cudacpu_b; }
"""

LAUNCHER = r"""// The launcher: a translation unit of its own (so that no macro of a kernel's -D options reaches it), linked into
// every kernel's shared library (labkit.cudacpu.compiler).
// A block's threads are cooperative threads, each with its own stack (ucontext), switched only at
// __syncthreads(): a real barrier, as no thread passes it before every thread of its block has reached it or
// returned. Between barriers the threads run in reverse order on even blocks and in order on odd ones, so a read
// of a shared element that another thread writes before the same barrier reads the NaN the block's shared memory
// was filled with, whichever neighbour writes it. Blocks run one after another, on the calling OS thread.
// A thread's context is made once (makecontext); later switches are _setjmp/_longjmp, which save no signal mask:
// a context switch costs no system call.
#include "cudacpu.h"

#include <dlfcn.h>
#include <link.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

extern "C" {
uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
// the bounds of the shared variables' section, from the linker (null when the source declares none)
extern char __start_cudacpu_shared[] __attribute__((weak, visibility("hidden")));
extern char __stop_cudacpu_shared[] __attribute__((weak, visibility("hidden")));
}
#pragma weak dladdr1

namespace cudacpu {
enum State { READY, WAITING, DONE };
struct Thread {
    ucontext_t context;
    jmp_buf resume;
    bool started;  // its context runs entry(): it is resumed with _longjmp from now on
    State state;
    uint3 index;
};
static const size_t STACK = 64 * 1024;  // per thread: the kit's kernels keep a few hundred floats in "registers"
static const unsigned MAX_THREADS = 1024;
static Thread* threads;
static char* stacks;
static unsigned capacity;
static size_t page;
static ucontext_t scheduler;
static jmp_buf back;  // the launcher, where a thread at a barrier or at its end returns
static Thread* current;
static void (*body)(void**);
static void** arguments;
static sigjmp_buf fault;
static char alternate[64 * 1024];

static void entry() {
    for (;;) {  // one CUDA thread per pass, then parked until a later block needs this slot
        body(arguments);
        current->state = DONE;
        if (!_setjmp(current->resume)) _longjmp(back, 1);
    }
}

static void run(Thread& th) {
    current = &th;
    threadIdx = th.index;
    if (_setjmp(back)) return;
    if (th.started) _longjmp(th.resume, 1);
    th.started = true;
    swapcontext(&scheduler, &th.context);
}

static void on_fault(int sig, siginfo_t*, void*) { siglongjmp(fault, sig); }

static bool reserve(unsigned n) {
    if (n <= capacity) return true;
    if (stacks) munmap(stacks, (size_t)capacity * STACK);
    free(threads);
    capacity = 0;
    page = (size_t)sysconf(_SC_PAGESIZE);
    threads = (Thread*)calloc(n, sizeof(Thread));
    void* m = mmap(nullptr, (size_t)n * STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (!threads || m == MAP_FAILED) return false;
    stacks = (char*)m;
    for (unsigned t = 0; t < n; ++t) mprotect(stacks + (size_t)t * STACK, page, PROT_NONE);  // a guard page each
    capacity = n;
    return true;
}

// a launch's stacks go back when it ends: every guard page is a mapping of its own, and a process that loads many
// kernels' libraries (each with its own launcher) would otherwise keep them all, up to the kernel's mapping limit
static void release() {
    if (stacks) munmap(stacks, (size_t)capacity * STACK);
    free(threads);
    stacks = nullptr, threads = nullptr, capacity = 0;
}
}  // namespace cudacpu

extern "C" void cudacpu_syncthreads(void) {
    cudacpu::Thread* me = cudacpu::current;
    me->state = cudacpu::WAITING;
    if (!_setjmp(me->resume)) _longjmp(cudacpu::back, 1);
}

// Run call(args) over grid x block (each 3 numbers). 0 when it ran; else a line in error.
extern "C" __attribute__((visibility("default"))) int cudacpu_launch(void (*call)(void**), void** args,
                                                                      const unsigned* grid, const unsigned* block,
                                                                      char* error, size_t error_size) {
    using namespace cudacpu;
    unsigned n = block[0] * block[1] * block[2];
    if (n == 0 || n > MAX_THREADS || grid[0] * grid[1] * grid[2] == 0) {
        snprintf(error, error_size, "invalid launch: grid (%u, %u, %u), block (%u, %u, %u) (at most %u threads a "
                 "block, none empty)", grid[0], grid[1], grid[2], block[0], block[1], block[2], MAX_THREADS);
        return 1;
    }
    if (!reserve(n)) {
        snprintf(error, error_size, "out of memory for the stacks of %u threads", n);
        return 1;
    }
    body = call;
    arguments = args;
    gridDim = dim3{grid[0], grid[1], grid[2]};
    blockDim = dim3{block[0], block[1], block[2]};
    stack_t alt = {}, old_alt;
    alt.ss_sp = alternate;
    alt.ss_size = sizeof alternate;
    struct sigaction trap = {}, old_segv, old_bus;
    trap.sa_sigaction = on_fault;
    trap.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&trap.sa_mask);
    sigaltstack(&alt, &old_alt);
    sigaction(SIGSEGV, &trap, &old_segv);
    sigaction(SIGBUS, &trap, &old_bus);
    int status = 0;
    if (sigsetjmp(fault, 1)) {
        for (unsigned t = 0; t < capacity; ++t) threads[t].started = false;  // their stacks hold nothing now
        snprintf(error, error_size, "an illegal memory access (or a stack overflow) in block (%u, %u, %u), thread "
                 "(%u, %u, %u)", blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
        status = 1;
    } else {
        size_t shared = __start_cudacpu_shared ? (size_t)(__stop_cudacpu_shared - __start_cudacpu_shared) : 0;
        for (unsigned bz = 0; bz < grid[2]; ++bz)
            for (unsigned by = 0; by < grid[1]; ++by)
                for (unsigned bx = 0; bx < grid[0]; ++bx) {
                    blockIdx = uint3{bx, by, bz};
                    if (shared) memset(__start_cudacpu_shared, 0xff, shared);  // NaN in every float
                    for (unsigned t = 0; t < n; ++t) {
                        Thread& th = threads[t];
                        th.index = uint3{t % block[0], t / block[0] % block[1], t / (block[0] * block[1])};
                        th.state = READY;
                        if (th.started) continue;
                        getcontext(&th.context);
                        th.context.uc_stack.ss_sp = stacks + (size_t)t * STACK + page;
                        th.context.uc_stack.ss_size = STACK - page;
                        th.context.uc_link = nullptr;
                        makecontext(&th.context, entry, 0);
                    }
                    bool reverse = (bx + grid[0] * (by + grid[1] * bz)) % 2 == 0;
                    for (;;) {  // one pass: every thread runs to its next barrier or to its end
                        for (unsigned k = 0; k < n; ++k) {
                            Thread& th = threads[reverse ? n - 1 - k : k];
                            if (th.state == READY) run(th);
                        }
                        bool waiting = false;
                        for (unsigned t = 0; t < n; ++t)
                            if (threads[t].state == WAITING) threads[t].state = READY, waiting = true;
                        if (!waiting) break;
                    }
                }
    }
    sigaction(SIGSEGV, &old_segv, nullptr);
    sigaction(SIGBUS, &old_bus, nullptr);
    sigaltstack(&old_alt, nullptr);
    release();
    return status;
}

// The size in bytes of the variable at addr (a __constant__ array), from the symbol table; -1 when unknown.
extern "C" __attribute__((visibility("default"))) long cudacpu_symbol_size(void* addr) {
    Dl_info info;
    const ElfW(Sym)* symbol = nullptr;
    if (!dladdr1 || !dladdr1(addr, &info, (void**)&symbol, RTLD_DL_SYMENT) || !symbol) return -1;
    return (long)symbol->st_size;
}

"""

TRAMPOLINES = r"""// Appended to a kernel's source (labkit.cudacpu.compiler): per __global__ kernel, CUDACPU_KERNEL(name) exports
// its parameters' kinds for Python and a call from an array of pointers to the arguments (as cuLaunchKernel's).
// Every name here starts with cudacpu: a kernel's -D options may define any short name as a macro.
namespace cudacpu_detail {
template <typename cudacpu_T> struct cudacpu_Kind { static constexpr char code = '?'; };
template <typename cudacpu_T> struct cudacpu_Kind<cudacpu_T*> { static constexpr char code = 'p'; };
template <> struct cudacpu_Kind<int> { static constexpr char code = 'i'; };
template <> struct cudacpu_Kind<unsigned int> { static constexpr char code = 'I'; };
template <> struct cudacpu_Kind<long> { static constexpr char code = 'l'; };
template <> struct cudacpu_Kind<unsigned long> { static constexpr char code = 'L'; };
template <> struct cudacpu_Kind<long long> { static constexpr char code = 'l'; };
template <> struct cudacpu_Kind<unsigned long long> { static constexpr char code = 'L'; };
template <> struct cudacpu_Kind<float> { static constexpr char code = 'f'; };
template <> struct cudacpu_Kind<double> { static constexpr char code = 'd'; };

template <typename... cudacpu_A> struct cudacpu_Signature {
    static constexpr char text[] = {cudacpu_Kind<cudacpu_A>::code..., 0};
};
template <typename... cudacpu_A> constexpr char cudacpu_Signature<cudacpu_A...>::text[];
template <typename... cudacpu_A> constexpr const char* cudacpu_signature(void (*)(cudacpu_A...)) {
    return cudacpu_Signature<cudacpu_A...>::text;
}

template <int... cudacpu_I> struct cudacpu_Sequence {};
template <int cudacpu_N, int... cudacpu_I> struct cudacpu_Make : cudacpu_Make<cudacpu_N - 1, cudacpu_N - 1, cudacpu_I...> {};
template <int... cudacpu_I> struct cudacpu_Make<0, cudacpu_I...> { typedef cudacpu_Sequence<cudacpu_I...> type; };
template <typename... cudacpu_A, int... cudacpu_I>
void cudacpu_invoke(void (*cudacpu_f)(cudacpu_A...), void** cudacpu_a, cudacpu_Sequence<cudacpu_I...>) {
    cudacpu_f(*(cudacpu_A*)cudacpu_a[cudacpu_I]...);
}
template <typename... cudacpu_A> void cudacpu_call(void (*cudacpu_f)(cudacpu_A...), void** cudacpu_a) {
    cudacpu_invoke(cudacpu_f, cudacpu_a, typename cudacpu_Make<sizeof...(cudacpu_A)>::type());
}
}  // namespace cudacpu_detail

#define CUDACPU_KERNEL(cudacpu_name)                                                                              \
    extern "C" __attribute__((visibility("default"))) const char* cudacpu_signature_##cudacpu_name(void) {      \
        return cudacpu_detail::cudacpu_signature(&cudacpu_name);                                                  \
    }                                                                                                             \
    extern "C" __attribute__((visibility("default"))) void cudacpu_call_##cudacpu_name(void** cudacpu_a) {      \
        cudacpu_detail::cudacpu_call(&cudacpu_name, cudacpu_a);                                                   \
    }
"""
