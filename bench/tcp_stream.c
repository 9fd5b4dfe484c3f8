/* What one loopback TCP stream carries on this machine, the limit the tcp
 * transport's busbw is measured against (issue 20 item 4). iperf3's defaults
 * (128 KiB writes, autotuned buffers) understate it, so this sends with the
 * sizes ferrocoll uses: WRITE-byte writes and reads (default 4 MiB, a large
 * message's one write), SO_SNDBUF/SO_RCVBUF of SOCKBUF bytes (default 4 MiB,
 * FERROCOLL_SOCKET_BUFFER's default; 0 keeps the kernel's autotuning),
 * TCP_NODELAY, a receive low-water mark of LOWAT bytes (default 256 KiB, as
 * the engine sets it for a large frame; 0 keeps the kernel's 1), and two
 * processes as two ranks. It measures, with blocking
 * reads and writes and a thread per direction (the best the kernel does,
 * which the engine's one non-blocking thread per rank is held against):
 *   one direction:   rank 1 writes, rank 0 reads (MSG_WAITALL);
 *   both directions: each rank writes and reads at once.
 * Build: cc -O2 -pthread -o tcp_stream bench/tcp_stream.c
 * Run:   ./tcp_stream [SECONDS [WRITE [SOCKBUF [LOWAT]]]]   (default 1 4194304 4194304 262144)
 * Prints one line per direction mode: GB/s per direction (10^9 bytes/s). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void configure(int fd, int sockbuf) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (sockbuf > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof sockbuf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf);
  }
}

/* One direction of a stream: writes `chunk`-byte pieces for `seconds`, then
 * shuts the socket's sending side; or reads to EOF. `rate`: bytes/s. */
struct dir {
  int fd, send, lowat;
  double seconds, rate;
  char *buf;
  size_t chunk;
};

static void *run_dir(void *arg) {
  struct dir *d = arg;
  unsigned long long moved = 0;
  double t0 = now(), stop = t0 + d->seconds;
  if (d->send) {
    while (now() < stop) {
      ssize_t k = write(d->fd, d->buf, d->chunk);
      if (k < 0 && errno != EINTR) die("write");
      if (k > 0) moved += k;
    }
    shutdown(d->fd, SHUT_WR);
  } else {
    /* As the engine sets it while a large frame arrives: the reader
     * wakes for 256 KiB, not for every packet (3.6 -> 4.5 GB/s one way). */
    if (d->lowat > 0) setsockopt(d->fd, SOL_SOCKET, SO_RCVLOWAT, &d->lowat, sizeof d->lowat);
    for (;;) {
      ssize_t k = recv(d->fd, d->buf, d->chunk, MSG_WAITALL);
      if (k < 0 && errno != EINTR) die("read");
      if (k == 0) break;
      if (k > 0) moved += k;
    }
  }
  d->rate = moved / (now() - t0);
  return 0;
}

/* Sends (if `send`) and receives (if `recv`) on `fd` at once, a thread per
 * direction; returns the receive rate (or the send rate for a sender only). */
static double pump(int fd, int send, int recv, double seconds, char *wbuf, char *rbuf, size_t chunk, int lowat) {
  struct dir w = {fd, 1, lowat, seconds, 0, wbuf, chunk}, r = {fd, 0, lowat, seconds, 0, rbuf, chunk};
  pthread_t tw;
  if (send && pthread_create(&tw, 0, run_dir, &w)) die("thread");
  if (recv) run_dir(&r);
  if (send) pthread_join(tw, 0);
  return recv ? r.rate : w.rate;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 1.0;
  size_t chunk = argc > 2 ? strtoull(argv[2], 0, 0) : 4 << 20;
  int sockbuf = argc > 3 ? atoi(argv[3]) : 4 << 20;
  int lowat = argc > 4 ? atoi(argv[4]) : 256 << 10;
  char *wbuf = malloc(chunk), *rbuf = malloc(chunk);
  memset(wbuf, 0x5a, chunk);
  memset(rbuf, 0, chunk);
  const char *modes[2] = {"one direction", "both directions"};
  for (int mode = 0; mode < 2; mode++) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    /* Options set on the connected sockets, as TcpChannel::new does. */
    if (bind(l, (void *)&a, sizeof a) || listen(l, 1) || getsockname(l, (void *)&a, &alen)) die("listen");
    int pipefd[2];
    if (pipe(pipefd)) die("pipe");
    pid_t child = fork();
    if (child == 0) { /* rank 1: connects, sends (and receives) */
      close(pipefd[0]);
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(fd, (void *)&a, sizeof a)) die("connect");
      configure(fd, sockbuf);
      double rate = pump(fd, 1, mode == 1, seconds, wbuf, rbuf, chunk, lowat);
      if (write(pipefd[1], &rate, sizeof rate) != sizeof rate) die("pipe write");
      _exit(0);
    }
    close(pipefd[1]);
    int fd = accept(l, 0, 0);
    if (fd < 0) die("accept");
    configure(fd, sockbuf);
    double mine = pump(fd, mode == 1, 1, seconds, wbuf, rbuf, chunk, lowat), theirs = 0;
    if (read(pipefd[0], &theirs, sizeof theirs) != sizeof theirs) die("pipe read");
    waitpid(child, 0, 0);
    close(fd);
    close(l);
    close(pipefd[0]);
    if (mode == 0)
      printf("# tcp stream limit, %s: %.2f GB/s (writes of %zu B, socket buffers %d B, low-water mark %d B)\n",
             modes[mode], mine / 1e9, chunk, sockbuf, lowat);
    else
      printf("# tcp stream limit, %s: %.2f + %.2f GB/s (writes of %zu B, socket buffers %d B, low-water mark %d B)\n",
             modes[mode], mine / 1e9, theirs / 1e9, chunk, sockbuf, lowat);
  }
  return 0;
}
