/* Copied from ../shared/peers/mpi_coll.c (which stays as it is) with `reduce` added (root 0,
 * busbw factor 1 as nccl-tests counts it), for bench/compare_all.sh.
 * Both buffers start at a page boundary (posix_memalign), as ferrocoll's bench places its own
 * (malloc put them 16 bytes into their pages; bench/RESULTS.md, seventh session).
 * Peer benchmark: MPI collectives with nccl-tests-style figures, one JSON line per size.
 * Build: mpicc -O2 -o mpi_coll mpi_coll.c
 * Run:   mpirun -np 2 --oversubscribe ./mpi_coll allreduce 8 33554432 4
 * Args:  collective (allreduce|allgather|reducescatter|alltoall|bcast|reduce) min_bytes max_bytes factor
 * Sizes are total bytes per rank as nccl-tests counts them (allreduce/bcast: the buffer;
 * allgather/reducescatter/alltoall: the full n-block buffer). f32, sum. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static double factor(const char *c, int n) {
  if (!strcmp(c, "allreduce")) return 2.0 * (n - 1) / n;
  if (!strcmp(c, "bcast") || !strcmp(c, "reduce")) return 1.0;
  return (double)(n - 1) / n;
}
static void run(const char *c, float *s, float *d, size_t cnt, int n) {
  size_t blk = cnt / n ? cnt / n : 1;
  if (!strcmp(c, "allreduce")) MPI_Allreduce(s, d, (int)cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (!strcmp(c, "allgather")) MPI_Allgather(s, (int)blk, MPI_FLOAT, d, (int)blk, MPI_FLOAT, MPI_COMM_WORLD);
  else if (!strcmp(c, "reducescatter")) MPI_Reduce_scatter_block(s, d, (int)blk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (!strcmp(c, "alltoall")) MPI_Alltoall(s, (int)blk, MPI_FLOAT, d, (int)blk, MPI_FLOAT, MPI_COMM_WORLD);
  else if (!strcmp(c, "bcast")) MPI_Bcast(s, (int)cnt, MPI_FLOAT, 0, MPI_COMM_WORLD);
  else if (!strcmp(c, "reduce")) MPI_Reduce(s, d, (int)cnt, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
}
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int r, n; MPI_Comm_rank(MPI_COMM_WORLD, &r); MPI_Comm_size(MPI_COMM_WORLD, &n);
  const char *c = argc > 1 ? argv[1] : "allreduce";
  size_t lo = argc > 2 ? atol(argv[2]) : 8, hi = argc > 3 ? atol(argv[3]) : (32 << 20);
  size_t f = argc > 4 ? atol(argv[4]) : 4;
  float *s, *d;
  if (posix_memalign((void **)&s, 4096, hi + 64 * n) || posix_memalign((void **)&d, 4096, hi + 64 * n)) return 1;
  for (size_t b = lo; b <= hi; b *= f) {
    size_t cnt = b / 4 ? b / 4 : 1;
    for (size_t i = 0; i < cnt; i++) s[i] = (float)(r + 1);
    int it = b < (1 << 16) ? 1000 : (b < (1 << 22) ? 100 : 10);
    for (int w = 0; w < 5; w++) run(c, s, d, cnt, n);
    int wrong = 0;
    if (!strcmp(c, "allreduce")) for (size_t i = 0; i < cnt; i++) wrong += d[i] != n * (n + 1) / 2.0f;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < it; i++) run(c, s, d, cnt, n);
    double t = (MPI_Wtime() - t0) / it, mx;
    MPI_Reduce(&t, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    double alg = b / mx / 1e9;
    if (!r) printf("{\"peer\":\"openmpi\",\"coll\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"time_us\":%.3f,\"algbw\":%.4f,\"busbw\":%.4f,\"wrong\":%d}\n",
                   c, n, b, mx * 1e6, alg, alg * factor(c, n), wrong);
    fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
