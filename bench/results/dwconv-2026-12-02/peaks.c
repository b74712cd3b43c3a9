// This machine's roofs for the depthwise figures: copy bandwidth (read + write, counted as
// both) over buffers from 256 KiB (L2) to 64 MiB (memory), and the f32 FMA peak (AVX-512,
// 12 independent accumulators), on 1 and 2 OpenMP threads; best of 20 repetitions.
//   gcc -O3 -march=native -fopenmp peaks.c -o peaks && ./peaks
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double now(void) { return omp_get_wtime(); }

static double copy_gbs(size_t bytes, int threads) {
    float *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes);
    memset(a, 1, bytes); memset(b, 0, bytes);
    size_t n = bytes / sizeof(float);
    double best = 1e9;
    int reps = bytes < (8u << 20) ? 200 : 20;
    for (int r = 0; r < 20; r++) {
        double t = now();
        for (int k = 0; k < reps / 20 + 1; k++) {
#pragma omp parallel for num_threads(threads) schedule(static)
            for (size_t i = 0; i < n; i += 16) _mm512_store_ps(b + i, _mm512_load_ps(a + i));
        }
        t = (now() - t) / (reps / 20 + 1);
        if (t < best) best = t;
    }
    free(a); free(b);
    return 2.0 * bytes / best / 1e9;
}

static double fma_gflops(int threads) {
    double best = 1e9;
    const long iters = 20000000;
    float out = 0;
    for (int r = 0; r < 5; r++) {
        double t = now();
#pragma omp parallel num_threads(threads) reduction(+:out)
        {
            __m512 acc[12];
            __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
            for (int j = 0; j < 12; j++) acc[j] = _mm512_set1_ps((float)j);
            for (long i = 0; i < iters; i++)
                for (int j = 0; j < 12; j++) acc[j] = _mm512_fmadd_ps(acc[j], x, y);
            __m512 s = acc[0];
            for (int j = 1; j < 12; j++) s = _mm512_add_ps(s, acc[j]);
            out += _mm512_reduce_add_ps(s);
        }
        t = now() - t;
        if (t < best) best = t;
    }
    if (out == 12345.0f) printf(" ");
    return 2.0 * 16 * 12 * iters * threads / best / 1e9;
}

int main(void) {
    for (int threads = 1; threads <= 2; threads++) {
        printf("threads %d: FMA peak %.1f GFLOP/s;", threads, fma_gflops(threads));
        size_t sizes[] = {256u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
        for (int i = 0; i < 5; i++) printf(" copy %zu KiB %.1f GB/s;", sizes[i] >> 10, copy_gbs(sizes[i], threads));
        printf("\n");
    }
    return 0;
}
