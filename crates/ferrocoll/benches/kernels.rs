//! Throughput of the f32 sum kernel on cache-resident data, next to a plain
//! copy of the same bytes (the floor any reduction pays: it reads two arrays
//! and writes one, a copy reads one and writes one).
//!
//! Run: `cargo bench -p ferrocoll --bench kernels`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn kernels(c: &mut Criterion) {
    let mut group = c.benchmark_group("f32");
    // 8 KiB and 64 KiB per operand stay in L1/L2 on any current x86 core.
    for &elems in &[2048usize, 16384] {
        let src: Vec<f32> = (0..elems).map(|i| i as f32).collect();
        let mut dst: Vec<f32> = vec![1.0; elems];
        group.throughput(Throughput::Bytes((elems * 4) as u64));
        group.bench_with_input(BenchmarkId::new("sum", elems * 4), &elems, |b, _| {
            b.iter(|| ferrocoll::kernels::sum_f32(black_box(&mut dst), black_box(&src)))
        });
        group.bench_with_input(BenchmarkId::new("copy", elems * 4), &elems, |b, _| {
            b.iter(|| black_box(&mut dst).copy_from_slice(black_box(&src)))
        });
    }
    group.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
