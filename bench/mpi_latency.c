/* Open MPI's side of bench/latency.sh: per-call latency of a small float sum
 * MPI_Allreduce, printed as crates/ferrocoll/examples/latency.rs prints it.
 * Build: mpicc -O2 -o mpi_latency bench/mpi_latency.c
 * Run:   mpirun -np 2 ./mpi_latency [CALLS] [COUNT] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int calls = argc > 1 ? atoi(argv[1]) : 200000, cnt = argc > 2 ? atoi(argv[2]) : 2;
  if (calls < 1) calls = 1;
  float *s = calloc(cnt + 1, sizeof(float)), *d = calloc(cnt + 1, sizeof(float));
  for (int i = 0; i < cnt; i++) s[i] = 1;
  double *t = malloc(sizeof(double) * calls);
  memset(t, 0, sizeof(double) * calls); /* no page fault while timing */
  for (int i = 0; i < 1000; i++) MPI_Allreduce(s, d, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < calls; i++) {
    double a = MPI_Wtime();
    MPI_Allreduce(s, d, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t[i] = MPI_Wtime() - a;
  }
  double total = MPI_Wtime() - t0, slow = 0;
  qsort(t, calls, sizeof(double), cmp);
  int over2 = 0, over10 = 0;
  for (int i = 0; i < calls; i++) {
    if (t[i] > 2e-6) over2++;
    if (t[i] > 10e-6) { over10++; slow += t[i]; }
  }
#define AT(q) (t[(int)((calls - 1) * (q))] * 1e6)
  printf("rank %d (Open MPI, %d calls of %d B): mean %.3f p50 %.3f p90 %.3f p99 %.3f p99.9 %.3f max %.1f us | "
         "calls >2us %d >10us %d, time in calls >10us %.1f%%\n",
         r, calls, (int)(cnt * sizeof(float)), total / calls * 1e6, AT(0.5), AT(0.9), AT(0.99), AT(0.999),
         AT(1.0), over2, over10, slow / total * 100);
  MPI_Finalize();
  return 0;
}
