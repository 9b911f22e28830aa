// The structure of the 2-D F(2 x 2, 5 x 5) kernel measured in winograd_2d_*.json/txt (2026-11-26), kept here because labkit/winograd.py
// replaced it with the row form. Host side as labkit/winograd.py's: U = G g G^T from a small kernel a filter
// (wino_weights, U[36][C][MP]); a block of T = 32 * TPL output tiles, 36 / XPW warps; dynamic shared memory of
// max(36 * CC * (T + MP), 36 * MC * T) floats. Macros: C M MP H W PAD HO WO ACT POOL TPL XPW CC MC MINB.
// The transforms bt6, g6 and at2 are F(2, 5)'s (labkit/winograd.py's matrices); the measured source also had #pragma unroll
// on every fixed loop, and its epilogue (elided: store) was the row kernel's.
extern "C" {
#define WARPS (36 / XPW)
#define THREADS (32 * WARPS)
#define T (32 * TPL)
#define TILES_Y (POOL ? HO / 2 : (HO + 1) / 2)
#define TILES_X (POOL ? WO / 2 : (WO + 1) / 2)

__global__ void __launch_bounds__(THREADS, MINB) wino_conv(const float* __restrict__ x, const float* __restrict__ U,
                                                          const float* __restrict__ bias, float* __restrict__ out,
                                                          int N) {
    extern __shared__ __align__(16) float smem[];
    float* Vs = smem;                // [36][CC][T]: the chunk's transformed inputs
    float* Us = smem + 36 * CC * T;  // [36][CC][MP]: the chunk's transformed filters
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int tiles = N * TILES_Y * TILES_X, g0 = blockIdx.x * T;
    float acc[XPW][TPL][MP] = {};
    for (int c0 = 0; c0 < C; c0 += CC) {
        for (int k = tid; k < 36 * CC * MP / 4; k += THREADS) {
            const int xi = k / (CC * MP / 4), r = k % (CC * MP / 4);
            reinterpret_cast<float4*>(Us)[k] = __ldg(reinterpret_cast<const float4*>(U + ((size_t)xi * C + c0) * MP) + r);
        }
        for (int p = tid; p < T * CC; p += THREADS) {  // a (tile, channel) pair: 6 x 6 inputs -> B^T d B
            const int t = p % T, c = p / T, g = g0 + t;
            float d[6][6] = {}, e[6][6];
            if (g < tiles) {
                const int n = g / (TILES_Y * TILES_X), r = g % (TILES_Y * TILES_X);
                const int y0 = 2 * (r / TILES_X) - PAD, x0 = 2 * (r % TILES_X) - PAD;
                const float* xc = x + ((size_t)n * C + c0 + c) * (H * W);
                for (int i = 0; i < 6; ++i)
                    for (int j = 0; j < 6; ++j) {
                        const int yy = y0 + i, xx = x0 + j;
                        d[i][j] = (yy >= 0 && yy < H && xx >= 0 && xx < W) ? __ldg(xc + yy * W + xx) : 0.0f;
                    }
            }
            for (int j = 0; j < 6; ++j) bt6(d[0][j], d[1][j], d[2][j], d[3][j], d[4][j], d[5][j], &e[0][j], 6);
            for (int i = 0; i < 6; ++i) {
                float v[6];
                bt6(e[i][0], e[i][1], e[i][2], e[i][3], e[i][4], e[i][5], v, 1);
                for (int j = 0; j < 6; ++j) Vs[((i * 6 + j) * CC + c) * T + t] = v[j];
            }
        }
        __syncthreads();
        for (int c = 0; c < CC; ++c)  // 36 GEMMs: warp w positions w * XPW .., a lane its tiles, every map
            for (int q = 0; q < XPW; ++q) {
                const int xi = warp * XPW + q;
                float v[TPL];
                for (int s = 0; s < TPL; ++s) v[s] = Vs[(xi * CC + c) * T + lane + 32 * s];
                const float4* u4 = reinterpret_cast<const float4*>(Us + (xi * CC + c) * MP);
                for (int m4 = 0; m4 < MP / 4; ++m4) {
                    const float4 u = u4[m4];
                    for (int s = 0; s < TPL; ++s) {
                        acc[q][s][4 * m4 + 0] += v[s] * u.x; acc[q][s][4 * m4 + 1] += v[s] * u.y;
                        acc[q][s][4 * m4 + 2] += v[s] * u.z; acc[q][s][4 * m4 + 3] += v[s] * u.w;
                    }
                }
            }
        __syncthreads();
    }
    float* Ms = smem;  // [36][MC][T]: MC maps' sums at a time, to the thread that owns (tile, map)
    for (int m0 = 0; m0 < MP; m0 += MC) {
        for (int q = 0; q < XPW; ++q)
            for (int s = 0; s < TPL; ++s)
                for (int mm = 0; mm < MC; ++mm)
                    if (m0 + mm < MP) Ms[((warp * XPW + q) * MC + mm) * T + lane + 32 * s] = acc[q][s][m0 + mm];
        __syncthreads();
        for (int p = tid; p < T * MC; p += THREADS) {  // A^T M A, bias, activation, the tile's pool window
            const int t = p % T, mm = p / T, m = m0 + mm, g = g0 + t;
            if (m >= M || g >= tiles) continue;
            const float* mx = Ms + mm * T + t;
            float z[2][6], y[2][2];
            for (int j = 0; j < 6; ++j) at2(mx + j * MC * T, 6 * MC * T, &z[0][j], &z[1][j]);
            for (int i = 0; i < 2; ++i) at2(&z[i][0], 1, &y[i][0], &y[i][1]);
            store(out, n_of(g), m, y, bias[m]);  // (as the row kernel's epilogue)
        }
        __syncthreads();
    }
}
}
