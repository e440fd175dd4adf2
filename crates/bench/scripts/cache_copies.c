// What a 256 KiB compare and copy cost on their own, to set beside their share of a
// profile under load (docs/benchmarks.md, "Where the bytes go"): `memcmp` of a prompt
// with a tree edge after other memory went through the cache (as the kernel's copies and
// the other processes' work do between two requests), with and without a thread copying
// 8 MiB in a loop, and the kernel's `rep movsb` copy at unaligned
// sources and destinations.
//
//   cc -O2 -pthread -o /tmp/cache_copies crates/bench/scripts/cache_copies.c && /tmp/cache_copies
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N (256 * 1024)

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static volatile int stop;

static void *copier(void *arg) {
    (void)arg;
    size_t m = 8 << 20;
    char *p = malloc(m), *q = malloc(m);
    memset(p, 1, m);
    while (!stop) memcpy(q, p, m);
    return NULL;
}

// Mean µs of one memcmp of N bytes after `flush` bytes were written and the prompt read;
// with `ahead`, 4 KiB at a time with the edge's lines `ahead` bytes on prefetched (the
// hardware's prefetchers stop at each 4 KiB page).
static double compare(size_t flush, size_t ahead) {
    char *a = malloc(N), *b = malloc(N), *f = malloc(flush + 1);
    memset(a, 'x', N);
    memset(b, 'x', N);
    volatile long sink = 0;
    double total = 0;
    int rounds = 2000;
    for (int r = 0; r < rounds; r++) {
        // A store to each line: a large memset streams past the cache and evicts nothing.
        for (size_t i = 0; i < flush; i += 64) f[i] = (char)r;
        for (size_t i = 0; i < N; i += 64) sink += a[i];
        double t0 = now_ns();
        if (!ahead) {
            sink += memcmp(a, b, N);
        } else {
            for (size_t i = 0; i < N; i += 4096) {
                for (size_t j = i + ahead; j < i + ahead + 4096 && j < N; j += 64) __builtin_prefetch(b + j);
                sink += memcmp(a + i, b + i, 4096);
            }
        }
        total += now_ns() - t0;
    }
    free(a), free(b), free(f);
    return total / rounds / 1000;
}

static void movsb(void *d, const void *s, size_t n) {
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n)::"memory");
}

int main(void) {
    size_t flushes[] = {0, 1 << 20, 4 << 20, 64 << 20};
    for (int k = 0; k < 4; k++) printf("memcmp 256 KiB, %zu KiB written before: %.2f us\n", flushes[k] >> 10, compare(flushes[k], 0));
    pthread_t t;
    pthread_create(&t, NULL, copier, NULL);
    printf("memcmp 256 KiB, 4096 KiB written before, a copier on another thread: %.2f us\n", compare(4 << 20, 0));
    printf("memcmp 256 KiB, 4096 KiB written before, prefetched 8 KiB ahead: %.2f us\n", compare(4 << 20, 8192));
    stop = 1;
    pthread_join(t, NULL);

    char *src = aligned_alloc(4096, N + 4096), *dst = aligned_alloc(4096, N + 4096);
    memset(src, 1, N + 4096);
    memset(dst, 2, N + 4096);
    int offsets[][2] = {{0, 0}, {16, 0}, {0, 16}, {1, 0}, {0, 1}, {200, 0}, {0, 200}, {17, 3}};
    for (int k = 0; k < 8; k++) {
        double best = 1e18;
        for (int r = 0; r < 300; r++) {
            double t0 = now_ns();
            movsb(dst + offsets[k][1], src + offsets[k][0], N);
            double t = now_ns() - t0;
            if (t < best) best = t;
        }
        printf("rep movsb 256 KiB, source +%d, destination +%d: %.2f us (best of 300)\n", offsets[k][0], offsets[k][1], best / 1000);
    }
    return 0;
}
