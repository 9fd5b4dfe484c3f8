/* How fast this machine's kernel copies between processes with process_vm_readv
 * (the shared-memory single copy, cross-memory attach) against a local memcpy, per size,
 * hot buffers: a child reads its parent's buffer. For bench/RESULTS.md, issue 20.
 * Build: cc -O2 -o /tmp/cma_speed bench/cma_speed.c
 * Run:   /tmp/cma_speed        (one line per size: time per read and GB/s, then memcpy's) */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
  size_t max = 8 << 20;
  char *src = aligned_alloc(4096, max);
  memset(src, 1, max);
  pid_t parent = getpid();
  pid_t child = fork();
  if (child < 0) { perror("fork"); return 1; }
  if (child > 0) { int st; waitpid(child, &st, 0); return WIFEXITED(st) ? WEXITSTATUS(st) : 1; }
  char *dst = aligned_alloc(4096, max);
  memset(dst, 0, max);
  for (size_t b = 4096; b <= max; b *= 2) {
    int it = b < (1 << 20) ? 2000 : 200;
    double best = 1e9, best_copy = 1e9;
    for (int rep = 0; rep < 5; rep++) {
      double t = now();
      for (int i = 0; i < it; i++) {
        struct iovec l = {dst, b}, r = {src, b};
        if (process_vm_readv(parent, &l, 1, &r, 1, 0) != (ssize_t)b) { perror("process_vm_readv"); return 1; }
      }
      double e = (now() - t) / it;
      if (e < best) best = e;
      t = now();
      for (int i = 0; i < it; i++) {
        memcpy(dst, src + (i & 1), b);
        __asm__ volatile("" ::"r"(dst) : "memory");
      }
      e = (now() - t) / it;
      if (e < best_copy) best_copy = e;
    }
    printf("%8zu B  process_vm_readv %8.2f us %6.2f GB/s   memcpy %8.2f us %6.2f GB/s\n", b,
           best * 1e6, b / best / 1e9, best_copy * 1e6, b / best_copy / 1e9);
  }
  return 0;
}
