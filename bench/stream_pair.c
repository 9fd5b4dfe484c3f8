// A 2-rank streamed allreduce through shared memory, stripped to its copies and
// flags (issue 20, tenth session): each process copies part i of its input into
// its outgoing slot, publishes it, and once the peer's part i is there reduces
// out = in + peer. A sender copies as many parts ahead as the slots allow, so
// SLOTS x PART is how far ahead of its reader a writer may run.
// Build: cc -O3 -march=native -o /tmp/stream_pair bench/stream_pair.c
// Usage: /tmp/stream_pair BYTES PART SLOTS ITERS [NT]   (NT=1: non-temporal copy-in)
//   e.g. /tmp/stream_pair 1048576 16384 16 1000; /tmp/stream_pair 1048576 131072 8 1000
// (at most 32 slots: the flags fill one page). Prints rank 0's mean and best call.
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
#include <immintrin.h>
#include <stdatomic.h>

typedef struct { _Atomic uint64_t seq; char pad[56]; } flag_t;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}

static void combine(float*restrict d,const float*restrict a,const float*restrict b,size_t n){
  for(size_t i=0;i<n;i++) d[i]=a[i]+b[i];
}
static void copy_nt(void*d,const void*s,size_t n){
  __m256i*D=d;const __m256i*S=s;for(size_t i=0;i<n/32;i++) _mm256_stream_si256(D+i,_mm256_loadu_si256(S+i)); _mm_sfence();
}
int main(int argc,char**argv){
  size_t bytes=strtoull(argv[1],0,0), part=strtoull(argv[2],0,0); int slots=atoi(argv[3]); int iters=atoi(argv[4]); int nt=argc>5?atoi(argv[5]):0;
  if(slots<1||slots>32||part%32){fprintf(stderr,"1-32 slots, PART a multiple of 32\n");return 2;}
  size_t ring=part*slots;
  // per direction: slots + flags (written seq by producer), acks (consumed seq by consumer)
  char*shm=mmap(0,2*ring+4096*4,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  memset(shm,0,2*ring+4096*4);
  flag_t*pub=(flag_t*)(shm+2*ring); flag_t*ack=(flag_t*)(shm+2*ring+4096);
  // pub[d*slots+s], ack[d]
  int pid=fork(); int me=pid==0?1:0;
  cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(me,&cs); sched_setaffinity(0,sizeof cs,&cs);
  float*in=aligned_alloc(4096,bytes),*out=aligned_alloc(4096,bytes);
  for(size_t i=0;i<bytes/4;i++){in[i]=me+1;out[i]=0;}
  char*mine=shm+me*ring,*theirs=shm+(1-me)*ring;
  size_t nparts=(bytes+part-1)/part; uint64_t sent=0,recvd=0;
  double best=1e9,tot=0;
  for(int it=0;it<iters+5;it++){
    // barrier via seq counters: simple: use parts counts as sync
    double t0=now();
    size_t s=0,r=0;
    while(r<nparts||s<nparts){
      // send as far as possible
      while(s<nparts && sent+s - atomic_load_explicit(&ack[1-me].seq,memory_order_acquire) < (uint64_t)slots){
        size_t n=(s+1)*part>bytes?bytes-s*part:part; uint64_t q=sent+s; char*slot=mine+(q%slots)*part;
        if(nt) copy_nt(slot,(char*)in+s*part,n); else memcpy(slot,(char*)in+s*part,n);
        atomic_store_explicit(&pub[me*slots+q%slots].seq,q+1,memory_order_release); s++;
      }
      uint64_t q=recvd+r;
      if(r<nparts && atomic_load_explicit(&pub[(1-me)*slots+q%slots].seq,memory_order_acquire)==q+1){
        size_t n=(r+1)*part>bytes?bytes-r*part:part;
        combine((float*)((char*)out+r*part),(float*)((char*)in+r*part),(float*)(theirs+(q%slots)*part),n/4);
        atomic_store_explicit(&ack[me].seq,q+1,memory_order_release); r++;
      } else _mm_pause();
    }
    sent+=nparts; recvd+=nparts;
    double t=now()-t0; if(it>=5){tot+=t; if(t<best)best=t;}
  }
  if(me==0){printf("%9zu B part %6zu slots %2d nt %d: avg %8.1f us best %8.1f us busbw %.2f GB/s\n",bytes,part,slots,nt,tot/iters*1e6,best*1e6,bytes/(tot/iters)/1e9);}
  if(pid) wait(0);
  return 0;
}
