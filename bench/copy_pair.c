/* The memory floor of a 2-rank allreduce of BYTES on this machine: two
 * processes, one per core, each copying a private BYTES input into a
 * private BYTES output at the same time, ITERS times. Whatever else a
 * 2-rank allreduce does, each rank at least reads its input and writes its
 * output once, and both ranks do so at once, so its time per call is at
 * least this copy's time per iteration (once the buffers outgrow the caches,
 * memory traffic sets both).
 * Build: gcc -O2 -o copy_pair bench/copy_pair.c
 * Run:   ./copy_pair BYTES ITERS   (prints each process's microseconds per
 *        copy and GB/s of BYTES per copy; the slower process counts) */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: copy_pair BYTES ITERS\n");
    return 2;
  }
  size_t bytes = strtoull(argv[1], 0, 10);
  int iters = atoi(argv[2]);
  /* A start line both processes wait at, so that their copies overlap. */
  _Atomic int *ready = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  pid_t child = fork();
  int me = child == 0 ? 1 : 0;
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(me, &s);
  sched_setaffinity(0, sizeof s, &s);
  char *in = malloc(bytes), *out = malloc(bytes);
  if (!in || !out) return 1;
  memset(in, me + 1, bytes);
  memset(out, 0, bytes);
  memcpy(out, in, bytes); /* one warm-up copy */
  atomic_fetch_add(ready, 1);
  while (atomic_load(ready) < 2) __builtin_ia32_pause();
  double t0 = now();
  for (int i = 0; i < iters; i++) {
    in[(i * 4096) % bytes] = (char)i; /* the input changes, as a gradient does */
    memcpy(out, in, bytes);
  }
  double us = (now() - t0) / iters * 1e6;
  printf("process %d: %zu B, %.1f us per copy, %.2f GB/s (check %d)\n", me, bytes, us, bytes / us / 1e3,
         out[bytes / 2]);
  if (child) wait(0);
  return 0;
}
