/*
 * One core's fp32 FMA peak with 256-bit vectors (AVX2 + FMA), by CPU time: twelve independent
 * chains of fused multiply-adds, enough to cover the FMA latency on every x86-64 core with two
 * FMA pipes. What `cpu_layers` takes as LAYA_BENCH_PEAK_GFLOPS on a machine whose boost clock
 * the VM hides (issue #43: the layers' share of the peak).
 *
 *   gcc -O2 -mavx2 -mfma tools/bench/fma_peak.c -o target/fma_peak && target/fma_peak
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define CHAINS 12

int main(void) {
    __m256 acc[CHAINS];
    const __m256 m = _mm256_set1_ps(1.0000001f), a = _mm256_set1_ps(0.999999f);
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_set1_ps((float)i);
    const long rounds = 400000000L / CHAINS;
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    for (long n = 0; n < rounds; n++) {
#pragma GCC unroll 12
        for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_fmadd_ps(acc[i], m, a);
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    /* The chains' values printed, so the compiler keeps them. */
    float sum = 0.0f, lane[8];
    for (int i = 0; i < CHAINS; i++) {
        _mm256_storeu_ps(lane, acc[i]);
        sum += lane[0];
    }
    /* 8 lanes x 2 FLOPs per fused multiply-add. */
    printf("%.2f GFLOP/s (%.3f s of CPU; checksum %g)\n", (double)rounds * CHAINS * 16 / s / 1e9, s, sum);
    return 0;
}
