// The CUDA built-ins the kit's kernels use, for a CPU: force-included (-include) before a CUDA C source that
// labkit.cudacpu compiles as C++ for this machine. Each CUDA thread of a block runs as a cooperative thread
// (launcher.cpp) that gives way only at __syncthreads(); threadIdx is set for it whenever it resumes. A kernel's
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
