/* The floor of a small allreduce between two processes on this machine:
 * two pinned processes that each store a counter into their own cache line
 * of shared memory and spin until the other's line shows the same count
 * (what a 2-rank allreduce of one cache line must at least do).
 * Build: gcc -O2 -o floor bench/floor.c
 * Run:   ./floor [FENCE]   (FENCE=1: a seq_cst fence after the store, as a
 *        sender that must see whether the receiver sleeps needs) */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
typedef struct { _Alignas(128) _Atomic unsigned long v; char pad[120]; } line;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
  int fence = argc > 1 ? atoi(argv[1]) : 0;
  line *sh = mmap(0, 4096 * 4, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  const unsigned long N = 1000000;
  pid_t child = fork();
  int me = child == 0 ? 1 : 0;
  cpu_set_t s; CPU_ZERO(&s); CPU_SET(me, &s); sched_setaffinity(0, sizeof s, &s);
  line *out = &sh[me * 8], *in = &sh[(1 - me) * 8]; /* 4 slots per direction */
  double t0 = now();
  for (unsigned long i = 1; i <= N; i++) {
    atomic_store_explicit(&out[i % 4].v, i, memory_order_release);
    if (fence) atomic_thread_fence(memory_order_seq_cst);
    while (atomic_load_explicit(&in[i % 4].v, memory_order_acquire) != i) __builtin_ia32_pause();
  }
  printf("process %d, fence %d: %.1f ns per exchange\n", me, fence, (now() - t0) / N * 1e9);
  if (child) wait(0);
  return 0;
}
