/* The floor of a 2-rank allgather on one host, with no library: two processes (pinned to CPUs
 * 0 and 1) meet at a spin barrier in shared memory, then each copies its own block into its
 * output and reads the peer's block with one process_vm_readv (or the read first: order 1),
 * the work Open MPI's and ferrocoll's 2-rank allgathers do. Prints the time per iteration and
 * of each part. For bench/RESULTS.md, issue 20.
 * Build: cc -O2 -o /tmp/exchange_floor bench/exchange_floor.c
 * Run:   /tmp/exchange_floor BLOCK_KIB ORDER ITERS   (e.g. 256 0 20000) */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <stdatomic.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t b=(size_t)atoi(argv[1])*1024; int order=atoi(argv[2]); int it=atoi(argv[3]);
  _Atomic long *sh = mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  char *src=malloc(b), *dst=malloc(2*b); memset(src,1,b); memset(dst,0,2*b);
  pid_t parent=getpid(); pid_t c=fork(); int me = c==0; pid_t peer = me? parent : c;
  cpu_set_t s; CPU_ZERO(&s); CPU_SET(me,&s); sched_setaffinity(0,sizeof s,&s);
  // exchange src addresses: malloc in same layout after fork -> same virtual address in both
  double tc=0, tr=0, t0=now();
  for(int i=0;i<it;i++){
    // barrier
    atomic_fetch_add(&sh[0],1); while(atomic_load(&sh[0]) < 2L*(i+1)) ;
    double a=now();
    struct iovec l={dst+(1-me)*b,b}, r={src,b};
    if(order==0){ memcpy(dst+me*b,src,b); double m=now(); tc+=m-a; if(process_vm_readv(peer,&l,1,&r,1,0)!=(ssize_t)b){perror("r");return 1;} tr+=now()-m; }
    else { if(process_vm_readv(peer,&l,1,&r,1,0)!=(ssize_t)b){perror("r");return 1;} double m=now(); tr+=m-a; memcpy(dst+me*b,src,b); tc+=now()-m; }
  }
  double tot=now()-t0;
  printf("%s order %s block %zuK: per iter %.2f us, memcpy %.2f us, cma %.2f us\n", me?"child":"parent", order? "cma-first":"copy-first", b/1024, tot/it*1e6, tc/it*1e6, tr/it*1e6);
  if(!me) wait(0);
  return 0;
}
