"""The tensor cores' side of the kit's CUDA C, for every kernel that multiplies on them (``labkit.ops.tensor_cores``'
conv, ``labkit.ops.fc_tensor_cores``' fc): ``mma.sync`` on TF32 and fp16, fp16 halves packed and unpacked, the
split of an fp32 value into a big and a (``LO_SCALE`` times larger) small fp16 part, and, for a machine without a
GPU, their emulation by ``labkit.cudacpu`` (a warp's fragments meet in shared memory between two barriers).

``DEVICE`` goes inside a source's ``extern "C"`` block, after its macros: the emulation's warp exchange sizes its
arrays by the source's ``THREADS``.
"""

DEVICE = r"""
#ifdef __CUDACC__
__device__ __forceinline__ float as_float(unsigned u) { return __uint_as_float(u); }
// d += a b over one 16 x 8 x 8 tile; a's, b's and d's elements are spread over the warp's lanes
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ float xor4(float v) { return __shfl_xor_sync(0xffffffffu, v, 4); }
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
// two floats as fp16 halves (round to nearest even), lo in the low 16 bits; and back
__device__ __forceinline__ unsigned pack_h2(float lo, float hi) {
    unsigned d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
__device__ __forceinline__ void unpack_h2(unsigned d, float& lo, float& hi) {
    asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}"
        : "=f"(lo), "=f"(hi) : "r"(d));
}
// the low halves of a and b as one word (a's low), and their high halves
__device__ __forceinline__ unsigned low_halves(unsigned a, unsigned b) { return __byte_perm(a, b, 0x5410); }
__device__ __forceinline__ unsigned high_halves(unsigned a, unsigned b) { return __byte_perm(a, b, 0x7632); }
// d += a b over one 16 x 8 x 16 tile of fp16 halves, fp32 sums
__device__ __forceinline__ void mma16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#else
// the CPU emulation: the same operations on a CPU, every lane of a block's warps calling them together
struct __align__(8) float2 { float x, y; };  // the emulation has no vector types
struct __align__(16) uint4 { unsigned x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct __align__(16) float4 { float x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
// a GPU faults on a float4 load not aligned to 16 bytes; so does the emulation (an illegal access at address 16)
static inline float4 load4(const float* p) {
    if ((size_t)p & 15) (void)*reinterpret_cast<volatile const float*>((size_t)16);
    float4 v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline unsigned as_bits(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }

// fp16 by hand: round to nearest even, subnormals, overflow to infinity (cvt.rn.f16.f32); and back
static unsigned f2h(float f) {
    unsigned x = as_bits(f), sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
    int e = (int)((x >> 23) & 0xff);
    if (e == 0xff) return sign | 0x7c00u | (mant ? 0x200u : 0u);
    int exp = e - 127 + 15;
    if (exp >= 31) return sign | 0x7c00u;
    if (exp <= 0) {
        if (exp < -10) return sign;
        mant |= 0x800000u;
        int shift = 14 - exp;
        unsigned h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) ++h;
        return sign | h;
    }
    unsigned h = ((unsigned)exp << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return sign | h;
}
static float h2f(unsigned h) {
    unsigned sign = (h & 0x8000u) << 16, mant = h & 0x3ffu;
    int exp = (int)((h >> 10) & 0x1f);
    if (exp == 0) {
        float v = mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) return as_float(sign | 0x7f800000u | (mant << 13));
    return as_float(sign | ((unsigned)(exp - 15 + 127) << 23) | (mant << 13));
}
static inline unsigned pack_h2(float lo, float hi) { return f2h(lo) | (f2h(hi) << 16); }
static inline unsigned low_halves(unsigned a, unsigned b) { return (a & 0xffffu) | (b << 16); }
static inline unsigned high_halves(unsigned a, unsigned b) { return (a >> 16) | (b & 0xffff0000u); }
static inline void unpack_h2(unsigned d, float& lo, float& hi) { lo = h2f(d & 0xffffu), hi = h2f(d >> 16); }

// a warp's MMA: its lanes' fragments meet in shared memory between two barriers. e elements a register: 1 (TF32,
// m16n8k8) or 2 (fp16 halves, m16n8k16). A[row][k] is lane (row % 8, k % 4e / e)'s register row / 8 + 2 (k / 4e),
// B[k][col] lane (col, k % 4e / e)'s register k / 4e; with halves, element k % 2 of the register
static float element(int e, unsigned word, int k) {
    return e == 1 ? as_float(word) : h2f(k % 2 ? word >> 16 : word & 0xffffu);
}

static void warp_mma(int e, float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    __shared__ unsigned emu_a[THREADS][4];
    __shared__ unsigned emu_b[THREADS][2];
    int me = threadIdx.x, base = me & ~31, g = (me & 31) >> 2, t = me & 3;
    for (int i = 0; i < 4; ++i) emu_a[me][i] = a[i];
    emu_b[me][0] = b0;
    emu_b[me][1] = b1;
    __syncthreads();
    for (int r = 0; r < 4; ++r) {
        int row = g + 8 * (r >> 1), col = 2 * t + (r & 1);
        float s = d[r];
        for (int k = 0; k < 8 * e; ++k) {
            unsigned aw = emu_a[base + (row % 8) * 4 + k % (4 * e) / e][row / 8 + 2 * (k / (4 * e))];
            unsigned bw = emu_b[base + col * 4 + k % (4 * e) / e][k / (4 * e)];
            s += element(e, aw, k) * element(e, bw, k);
        }
        d[r] = s;
    }
    __syncthreads();
}
static void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) { warp_mma(1, d, a, b0, b1); }
static void mma16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) { warp_mma(2, d, a, b0, b1); }

static float xor4(float v) {
    __shared__ float emu_v[THREADS];
    emu_v[threadIdx.x] = v;
    __syncthreads();
    float other = emu_v[threadIdx.x ^ 4];
    __syncthreads();
    return other;
}
#endif

// F16: the small parts are kept 2^11 times larger (fp16's range), their sums scaled back at the end
#define LO_SCALE 2048.0f
// two floats as fp16 halves, big and (LO_SCALE times) small: v == big + small / LO_SCALE to about 2^-22 of v
__device__ __forceinline__ void split_h2(float v0, float v1, unsigned& big, unsigned& small) {
    float b0, b1;
    big = pack_h2(v0, v1);
    unpack_h2(big, b0, b1);
    small = pack_h2((v0 - b0) * LO_SCALE, (v1 - b1) * LO_SCALE);
}
// a value fp16 cannot hold (or a NaN) becomes a NaN, so that every output it reaches is one
__device__ __forceinline__ float half_range(float v) { return fabsf(v) <= 65504.0f ? v : as_float(0x7fc00000u); }
"""
