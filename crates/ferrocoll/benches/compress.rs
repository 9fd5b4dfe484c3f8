//! Throughput of each codec of `ferrocoll::compress` on a 4 MiB `f32`
//! buffer (bytes of `f32` input per second), next to a memcpy of the same
//! 4 MiB: encode, decode_add (what a reduction hop does with a received
//! chunk), and encode + decode (a round trip, what error feedback pays per
//! step). PowerSGD runs its three local steps on a 1024 x 1024 matrix with
//! the two allreduces left out.
//!
//! Run: `cargo bench -p ferrocoll --bench compress`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrocoll::compress::{
    Bf16, Codec, ErrorFeedback, Fp16, Int8Block, Keep, OneBit, PowerSgd, PowerSgdConfig, RandK,
    TopK,
};

const ELEMENTS: usize = 1 << 20; // 4 MiB of f32

/// Gradient-like data: mostly small values, a few large ones, both signs.
fn gradient(len: usize) -> Vec<f32> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let unit = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            unit * if i % 97 == 0 { 10.0 } else { 0.1 }
        })
        .collect()
}

fn codecs() -> Vec<Box<dyn Codec>> {
    vec![
        Box::new(Fp16),
        Box::new(Bf16),
        Box::new(Int8Block::new(128).unwrap()),
        Box::new(OneBit::new(128).unwrap()),
        Box::new(TopK::new(Keep::Fraction(0.01)).unwrap()),
        Box::new(RandK::new(Keep::Fraction(0.01), 7).unwrap()),
    ]
}

fn compress(c: &mut Criterion) {
    let src = gradient(ELEMENTS);
    let bytes = (ELEMENTS * 4) as u64;
    let mut group = c.benchmark_group("compress_4MiB");
    group.throughput(Throughput::Bytes(bytes));
    group.sample_size(30);

    let mut copy = vec![0f32; ELEMENTS];
    group.bench_function("memcpy", |b| {
        b.iter(|| black_box(&mut copy).copy_from_slice(black_box(&src)))
    });

    let mut out = vec![0f32; ELEMENTS];
    for codec in codecs() {
        let name = codec.name();
        let mut wire = vec![0u8; codec.encoded_len(ELEMENTS)];
        group.bench_function(BenchmarkId::new("encode", &name), |b| {
            b.iter(|| codec.encode(black_box(&src), black_box(&mut wire)).unwrap())
        });
        codec.encode(&src, &mut wire).unwrap();
        group.bench_function(BenchmarkId::new("decode_add", &name), |b| {
            b.iter(|| {
                codec
                    .decode_add(black_box(&wire), black_box(&mut out))
                    .unwrap()
            })
        });
        group.bench_function(BenchmarkId::new("encode+decode", &name), |b| {
            b.iter(|| {
                codec.encode(black_box(&src), black_box(&mut wire)).unwrap();
                codec.decode(black_box(&wire), black_box(&mut out)).unwrap();
            })
        });
    }

    // Error feedback around the int8 codec: the round trip plus the
    // residual's two passes.
    let int8 = Int8Block::new(128).unwrap();
    let mut ef = ErrorFeedback::new(ELEMENTS);
    let mut wire = vec![0u8; int8.encoded_len(ELEMENTS)];
    group.bench_function(BenchmarkId::new("error_feedback", int8.name()), |b| {
        b.iter(|| {
            ef.compress(black_box(&src), &int8, black_box(&mut wire))
                .unwrap()
        })
    });

    for rank in [1, 4] {
        let config = PowerSgdConfig {
            rank,
            shape: Some((1024, 1024)),
            ..PowerSgdConfig::default()
        };
        let mut state = PowerSgd::new(ELEMENTS, config).unwrap();
        group.bench_function(
            BenchmarkId::new("powersgd_local_steps", format!("1024x1024_r{rank}")),
            |b| {
                b.iter(|| {
                    state.compress_p(black_box(&src)).unwrap();
                    state.after_p_allreduce().unwrap();
                    state.decompress(black_box(&mut out)).unwrap();
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, compress);
criterion_main!(benches);
