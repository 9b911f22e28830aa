"""The CUDA C source of ``labkit.tensor_cores``' conv, ``conv_split3``: one source for every plan, which its macros
shape (``Plan.macros``: the layer's sizes, the configuration, the staged window's layout), with the MMA and the
shuffle for a GPU and their emulation for the CPU (``labkit.cudacpu``). Apart from the plans and the launch, which
read as Python; a release leaves both out up to milestone 09 (``labkit.leave_out``).
"""

from . import mma_source

HEAD = r"""
#define K_REAL (C * R * R)
// k's an MMA takes: 8 (TF32, m16n8k8) or 16 (F16: fp16 halves, m16n8k16)
#define KS (F16 ? 16 : 8)
// NSLOTS k slots (K_REAL and zero weights past it); SROW, SCH: the staged window's row and channel strides in words
#define KSTEPS (NSLOTS / KS)
#define NT ((M + 7) / 8)
#define WH (H + 2 * PAD)
#define WW (W + 2 * PAD)
#define HO (WH - R + 1)
#define WO (WW - R + 1)
#define HP (P == 2 ? HO / 2 : HO)
#define WP (P == 2 ? WO / 2 : WO)
// a tile is 16 conv outputs: 16 pixels, or 4 pool windows of 4
#define PER_TILE (P == 2 ? 4 : 16)
#define SPOTS (IMGS * HP * WP)
#define TILES ((SPOTS + PER_TILE - 1) / PER_TILE)
#define THREADS (WARPS * 32)
#define PASSES ((TILES + WARPS * MT - 1) / (WARPS * MT))
#define WF_FLOATS (KSTEPS * NT * 32 * (BPRE || F16 ? 4 : 2))
#define XS_FLOATS (IMGS * C * SCH)
#define SMEM_FLOATS (WF_FLOATS + NSLOTS + XS_FLOATS * (APRE && !F16 ? 2 : 1))
// BREG: a short k loop's B fragments (the weights) held in registers for the block's whole run (4 per k step and map
// tile), instead of read from shared memory for every tile
#define USE_BREG (BREG && F16 && KSTEPS <= 8)

extern "C" {

// a NaN stays a NaN through the activation and the pool (fmaxf would drop it): an F16 input out of range shows
__device__ __forceinline__ float activate(float v) {
    return ACT == 1 ? (v != v ? v : fmaxf(v, 0.0f)) : ACT == 2 ? tanhf(v) : v;
}
__device__ __forceinline__ float max_nan(float a, float b) { return (a != a || a > b) ? a : b; }

"""

SOURCE = HEAD + mma_source.DEVICE + r"""
#ifdef __CUDACC__
extern __shared__ __align__(16) float smem[];

// TF32 rounding to nearest (a conversion instruction), or toward zero (one AND on the integer pipe)
__device__ __forceinline__ unsigned to_tf32(float v) {
    unsigned r;
    if (ROUND)
        asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    else
        r = __float_as_uint(v) & 0xffffe000u;
    return r;
}
#else
// cvt.rna.tf32.f32 (round to nearest, ties away from zero, to 10 mantissa bits), or the mask (toward zero)
static inline unsigned to_tf32(float v) {
    return ROUND ? (as_bits(v) + 0x1000u) & 0xffffe000u : as_bits(v) & 0xffffe000u;
}
__shared__ __align__(16) float smem[SMEM_FLOATS];
#endif

// KPERM: slot s takes k = KSLOTS[s], or (KSLOTS[s] >= K_REAL) a zero weight reading where k = KSLOTS[s] - K_REAL
// reads (labkit.conv_banks: each load of a warp then hits 32 banks); else k = s, zero weights reading the pixel itself
#ifdef KSLOTS
__constant__ int kslots[NSLOTS] = {KSLOTS};
#endif
__device__ __forceinline__ int slot_k(int s) {
#ifdef KSLOTS
    return kslots[s] < K_REAL ? kslots[s] : -1;
#else
    return s < K_REAL ? s : -1;
#endif
}
__device__ __forceinline__ int slot_offset(int s) {
#ifdef KSLOTS
    const int k = kslots[s] % K_REAL;
#else
    const int k = s < K_REAL ? s : 0;
#endif
    return k / (R * R) * SCH + k % (R * R) / R * SROW + k % R;
}

// F16: a value fp16 cannot hold (or a NaN) becomes a NaN, so that every output it reaches is one
__device__ __forceinline__ float in_range(float v) { return F16 ? half_range(v) : v; }

// fp32 v as two TF32 numbers: big + small == v to about 2^-22 of v
__device__ __forceinline__ void split(float v, unsigned& big, unsigned& small) {
    big = to_tf32(v);
    small = to_tf32(v - as_float(big));
}

// where in the staged window row r of a tile (0..15) reads its pixel: 16 pixels, or 4 pool windows of 4
__device__ __forceinline__ int pixel_offset(int tile, int r) {
    int spot = tile * PER_TILE + (P == 2 ? (r & 7) >> 1 : r);
    if (spot >= SPOTS) spot = 0;  // a tile past the last: computed, never stored
    int img = spot / (HP * WP), q = spot % (HP * WP);
    int oy = q / WP, ox = q % WP;
    if (P == 2) {
        oy = 2 * oy + (r >> 3);
        ox = 2 * ox + (r & 1);
    }
    return img * C * SCH + oy * SROW + ox;
}

// one staged value: as it is, or split once (APRE): fp16's big half (low) and small one (high) in one word, or the
// TF32 parts, big then (XS_FLOATS on) small
__device__ __forceinline__ void put(float* xs, int i, float v) {
    unsigned* xsu = reinterpret_cast<unsigned*>(xs);
    unsigned big, small;
    if (F16 && APRE) {
        split_h2(v, 0.0f, big, small);
        xsu[i] = low_halves(big, small);
    } else if (APRE) {
        split(v, big, small);
        xsu[i] = big;
        xsu[XS_FLOATS + i] = small;
    } else {
        xs[i] = v;
    }
}

// a group's images into the windows' interiors, STAGE_VEC consecutive values a chunk (float4 loads where vec) and
// STAGE_UNROLL chunks' loads in flight a thread before any is stored; images past N are staged as zeros
#define PLANE (H * W)
#define STAGE_VEC (W % 4 == 0 ? 4 : 1)
#define CHUNKS (IMGS * C * PLANE / STAGE_VEC)
#define STAGE_UNROLL 4
__device__ __forceinline__ void stage(const float* __restrict__ x, float* xs, int n0, int N, int tid, bool vec) {
    for (int i0 = tid; i0 < CHUNKS; i0 += STAGE_UNROLL * THREADS) {
        float v[STAGE_UNROLL][4];
#pragma unroll
        for (int u = 0; u < STAGE_UNROLL; ++u) {
            const int i = i0 + u * THREADS;
            const bool ok = i < CHUNKS && n0 + i * STAGE_VEC / (C * PLANE) < N;
            const float* at = x + (size_t)n0 * C * PLANE + (size_t)i * STAGE_VEC;
            if (STAGE_VEC == 4 && vec) {
                const float4 q = ok ? load4(at) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                v[u][0] = q.x, v[u][1] = q.y, v[u][2] = q.z, v[u][3] = q.w;
            } else {
#pragma unroll
                for (int j = 0; j < STAGE_VEC; ++j) v[u][j] = ok ? at[j] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < STAGE_UNROLL; ++u) {
            const int e = (i0 + u * THREADS) * STAGE_VEC;
            if (e < CHUNKS * STAGE_VEC) {
                const int img = e / (C * PLANE), c = e / PLANE % C, r = e % PLANE / W, s = e % W;
                const int to = (img * C + c) * SCH + (r + PAD) * SROW + s + PAD;
#pragma unroll
                for (int j = 0; j < STAGE_VEC; ++j) put(xs, to + j, in_range(v[u][j]));
            }
        }
    }
}

__global__ void __launch_bounds__(THREADS, MINB)
conv_split3(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
            float* __restrict__ out, int N) {
    // [kstep][map tile][lane]: the lane's two B values, or (BPRE) their TF32 parts, big and small
    float2* wf = reinterpret_cast<float2*>(smem);
    uint4* wp = reinterpret_cast<uint4*>(smem);
    int* koff = reinterpret_cast<int*>(smem + WF_FLOATS);  // k -> its offset in an image's window
    float* xs = smem + WF_FLOATS + NSLOTS;  // [image][channel][row][column], zero-padded
    unsigned* xsu = reinterpret_cast<unsigned*>(xs);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

    for (int i = tid; i < KSTEPS * NT * 32 && F16; i += THREADS) {
        // b0 holds k = 2t, 2t + 1 of map g, b1 k = 2t + 8, 2t + 9; each as halves, big then small
        int l = i & 31, m = (i >> 5) % NT * 8 + (l >> 2), k = i / (NT * 32) * 16 + 2 * (l & 3);
        float v[4];
        for (int e = 0; e < 4; ++e) {
            int ke = slot_k(k + (e & 1) + 8 * (e >> 1));
            v[e] = (m < M && ke >= 0) ? in_range(w[m * K_REAL + ke]) : 0.0f;
        }
        uint4 q;
        split_h2(v[0], v[1], q.x, q.z);
        split_h2(v[2], v[3], q.y, q.w);
        wp[i] = q;
    }
    for (int i = tid; i < KSTEPS * NT * 32 && !F16; i += THREADS) {
        int l = i & 31, m = (i >> 5) % NT * 8 + (l >> 2), k = i / (NT * 32) * 8 + (l & 3);
        const int k0 = slot_k(k), k1 = slot_k(k + 4);
        float b0 = (m < M && k0 >= 0) ? w[m * K_REAL + k0] : 0.0f;
        float b1 = (m < M && k1 >= 0) ? w[m * K_REAL + k1] : 0.0f;
        if (BPRE) {
            uint4 v;
            split(b0, v.x, v.z);
            split(b1, v.y, v.w);
            wp[i] = v;
        } else {
            wf[i] = make_float2(b0, b1);
        }
    }
    for (int k = tid; k < NSLOTS; k += THREADS) koff[k] = slot_offset(k);
    // the window's borders (and the words past a row or a channel) are zeroed once: a group writes its interior
    for (int i = tid; i < XS_FLOATS * (APRE && !F16 ? 2 : 1); i += THREADS) xs[i] = 0.0f;
    const bool vec = STAGE_VEC == 4 && ((size_t)x & 15) == 0;  // float4 loads where x is aligned to them
    uint4 breg[USE_BREG ? KSTEPS : 1][NT];
    if (USE_BREG) {
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < (USE_BREG ? KSTEPS : 1); ++ks)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) breg[ks][nt] = wp[(ks * NT + nt) * 32 + lane];
    }

    for (int group = blockIdx.x; group * IMGS < N; group += gridDim.x) {
        const int n0 = group * IMGS;
        __syncthreads();  // the previous group's reads of xs are done (and, the first time, wf and koff are in)
        stage(x, xs, n0, N, tid, vec);
        __syncthreads();

        for (int pass = 0; pass < PASSES; ++pass) {
            const int tile0 = (pass * WARPS + warp) * MT;
            int off[MT][2];
            float acc[MT][NT][4], lo[MT][NT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                off[mt][0] = pixel_offset(tile0 + mt, g);
                off[mt][1] = pixel_offset(tile0 + mt, g + 8);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int r = 0; r < 4; ++r) acc[mt][nt][r] = lo[mt][nt][r] = 0.0f;
            }
#pragma unroll (KSTEPS <= 8 ? 8 : 2)  // a short k loop whole: cifar10's conv1 takes 5 steps
            for (int ks = 0; ks < KSTEPS && F16; ++ks) {
                // lane (g, t) takes k = 2t, 2t + 1 (ka) and 2t + 8, 2t + 9 (kb) of rows g and g + 8
                const int2 ka = *reinterpret_cast<const int2*>(koff + ks * 16 + 2 * t);
                const int2 kb = *reinterpret_cast<const int2*>(koff + ks * 16 + 2 * t + 8);
                uint4 bq[NT];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    bq[nt] = USE_BREG ? breg[USE_BREG ? ks : 0][nt] : wp[(ks * NT + nt) * 32 + lane];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const int o0 = off[mt][0], o1 = off[mt][1];
                    unsigned hi[4], sm[4];
                    if (APRE) {  // the staged words hold both halves: two byte permutes a pair
                        const unsigned q[8] = {xsu[o0 + ka.x], xsu[o0 + ka.y], xsu[o1 + ka.x], xsu[o1 + ka.y],
                                               xsu[o0 + kb.x], xsu[o0 + kb.y], xsu[o1 + kb.x], xsu[o1 + kb.y]};
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            hi[e] = low_halves(q[2 * e], q[2 * e + 1]);
                            sm[e] = high_halves(q[2 * e], q[2 * e + 1]);
                        }
                    } else {
                        split_h2(xs[o0 + ka.x], xs[o0 + ka.y], hi[0], sm[0]);
                        split_h2(xs[o1 + ka.x], xs[o1 + ka.y], hi[1], sm[1]);
                        split_h2(xs[o0 + kb.x], xs[o0 + kb.y], hi[2], sm[2]);
                        split_h2(xs[o1 + kb.x], xs[o1 + kb.y], hi[3], sm[3]);
                    }
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {  // the small terms into sums of their own, LO_SCALE larger
                        mma16(lo[mt][nt], sm, bq[nt].x, bq[nt].y);
                        mma16(lo[mt][nt], hi, bq[nt].z, bq[nt].w);
                        mma16(acc[mt][nt], hi, bq[nt].x, bq[nt].y);
                    }
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int r = 0; r < 4; ++r) acc[mt][nt][r] += lo[mt][nt][r] * (1.0f / LO_SCALE);
#pragma unroll 2
            for (int ks = 0; ks < KSTEPS && !F16; ++ks) {
                const int k0 = koff[ks * 8 + t], k1 = koff[ks * 8 + t + 4];
                unsigned bb[NT][2], bs[NT][2];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    if (BPRE) {
                        uint4 v = wp[(ks * NT + nt) * 32 + lane];
                        bb[nt][0] = v.x, bb[nt][1] = v.y, bs[nt][0] = v.z, bs[nt][1] = v.w;
                    } else {
                        float2 v = wf[(ks * NT + nt) * 32 + lane];
                        split(v.x, bb[nt][0], bs[nt][0]);
                        split(v.y, bb[nt][1], bs[nt][1]);
                    }
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    unsigned ab[4], as[4];
                    const int at[4] = {off[mt][0] + k0, off[mt][1] + k0, off[mt][0] + k1, off[mt][1] + k1};
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if (APRE) {
                            ab[e] = xsu[at[e]];
                            as[e] = xsu[XS_FLOATS + at[e]];
                        } else {
                            split(xs[at[e]], ab[e], as[e]);
                        }
                    }
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {  // the small terms first: they are the smallest
                        mma(acc[mt][nt], as, bb[nt][0], bb[nt][1]);
                        mma(acc[mt][nt], ab, bs[nt][0], bs[nt][1]);
                        mma(acc[mt][nt], ab, bb[nt][0], bb[nt][1]);
                    }
                }
            }
            // the epilogue: lane (g, t) holds rows g and g + 8, maps nt * 8 + 2t and + 1
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int tile = tile0 + mt;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int m = nt * 8 + 2 * t + e;
                        if (P == 2) {
                            // rows g and g + 8 are a window's two rows; lane g ^ 1 (lane ^ 4) has its other column
                            float v = max_nan(acc[mt][nt][e], acc[mt][nt][e + 2]);
                            v = max_nan(v, xor4(v));
                            int spot = tile * PER_TILE + (g >> 1), img = spot / (HP * WP), n = n0 + img;
                            if ((g & 1) == 0 && m < M && spot < SPOTS && n < N)
                                out[((size_t)n * M + m) * (HP * WP) + spot % (HP * WP)] = activate(v + b[m]);
                        } else {
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                int spot = tile * PER_TILE + g + 8 * h, img = spot / (HP * WP), n = n0 + img;
                                if (m < M && spot < SPOTS && n < N)
                                    out[((size_t)n * M + m) * (HP * WP) + spot % (HP * WP)] =
                                        activate(acc[mt][nt][e + 2 * h] + b[m]);
                            }
                        }
                    }
                }
            }
        }
    }
}
}
"""
