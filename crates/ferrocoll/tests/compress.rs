//! The properties every codec of `ferrocoll::compress` promises, checked
//! through the public API for all of them at once (each codec's own tests,
//! in its module, check its arithmetic).

use ferrocoll::compress::{self, Codec, ErrorFeedback};
use proptest::prelude::*;

/// Every codec, in the spellings `compress::parse` takes.
const SPECS: &[&str] = &[
    "fp16",
    "bf16",
    "int8:64",
    "int8:128",
    "int8:256",
    "onebit:64",
    "onebit:128",
    "onebit:256",
    "topk:0.01",
    "topk:0.3",
    "topk:5",
    "randk:0.1:3",
    "randk:7:3:unscaled",
];

fn all() -> Vec<Box<dyn Codec>> {
    SPECS.iter().map(|s| compress::parse(s).unwrap()).collect()
}

/// Deterministic data of both signs and a spread of magnitudes.
fn data(seed: u64, len: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let unit = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            unit * (1 + i % 13) as f32
        })
        .collect()
}

#[test]
fn encoded_len_is_what_encode_writes_for_every_length_near_a_block_edge() {
    let mut lens: Vec<usize> = (0..=300).collect();
    for edge in [511, 512, 513, 65_535, 65_536, 65_537, 131_073] {
        lens.push(edge);
    }
    for codec in all() {
        for &n in &lens {
            let src = data(n as u64, n);
            let wire = codec.encode_to_vec(&src).unwrap();
            assert_eq!(wire.len(), codec.encoded_len(n), "{} at {n}", codec.name());
            // A buffer of another length is refused, both ways (the element
            // count comes from the caller: n + 1 elements may well encode to
            // as many bytes as n, for the bit-packed and the count-k codecs).
            let mut longer = vec![0u8; wire.len() + 1];
            assert!(codec.encode(&src, &mut longer).is_err(), "{}", codec.name());
            let mut out = vec![0f32; n + 1];
            if codec.encoded_len(n + 1) != wire.len() {
                assert!(codec.decode(&wire, &mut out).is_err(), "{}", codec.name());
            }
            let mut out = vec![0f32; n];
            codec.decode(&wire, &mut out).unwrap();
        }
    }
}

#[test]
fn zero_length_chunks_encode_to_nothing() {
    for codec in all() {
        assert_eq!(codec.encoded_len(0), 0, "{}", codec.name());
        assert!(codec.encode_to_vec(&[]).unwrap().is_empty());
        codec.decode(&[], &mut []).unwrap();
        codec.decode_add(&[], &mut []).unwrap();
        assert_eq!(codec.ratio(0), 1.0);
    }
}

#[test]
fn the_properties_each_codec_declares() {
    for codec in all() {
        let name = codec.name();
        assert!(codec.lossy() && codec.deterministic(), "{name}");
        assert_eq!(
            codec.unbiased(),
            name.starts_with("randk") && !name.ends_with("unscaled")
        );
        let blocked = name.starts_with("int8") || name.starts_with("onebit");
        let granule = codec.granule();
        match granule {
            Some(1) => assert!(name.ends_with("16"), "{name}"),
            Some(g) => assert!(blocked && name.ends_with(&format!(":{g}")), "{name}"),
            None => assert!(
                name.starts_with("topk") || name.starts_with("randk"),
                "{name}"
            ),
        }
        assert!(
            codec.ratio(1 << 20) > 1.9,
            "{name}: {}",
            codec.ratio(1 << 20)
        );
        // The same input gives the same bytes (every rank agrees).
        let src = data(1, 1000);
        assert_eq!(
            codec.encode_to_vec(&src).unwrap(),
            codec.encode_to_vec(&src).unwrap()
        );
    }
}

#[test]
fn error_feedback_works_with_every_codec_but_rescaled_random_k() {
    for codec in all().into_iter().filter(|c| !c.unbiased()) {
        let mut ef = ErrorFeedback::new(777);
        let mut given = vec![0f64; 777];
        let mut sent = vec![0f64; 777];
        let mut out = vec![0f32; 777];
        for step in 0..20 {
            let grad = data(step, 777);
            let wire = ef.compress_to_vec(&grad, codec.as_ref()).unwrap();
            codec.decode(&wire, &mut out).unwrap();
            given
                .iter_mut()
                .zip(&grad)
                .for_each(|(s, &g)| *s += g as f64);
            sent.iter_mut().zip(&out).for_each(|(s, &v)| *s += v as f64);
        }
        for (i, ((s, e), g)) in sent.iter().zip(ef.residual()).zip(&given).enumerate() {
            let err = (s + *e as f64 - g).abs();
            assert!(err < 1e-3, "{}: element {i} off by {err}", codec.name());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn decode_add_is_decode_then_add(
        which in 0..SPECS.len(),
        len in 0usize..2000,
        seed in any::<u64>(),
    ) {
        let codec = compress::parse(SPECS[which]).unwrap();
        let wire = codec.encode_to_vec(&data(seed, len)).unwrap();
        let mut decoded = vec![0f32; len];
        codec.decode(&wire, &mut decoded).unwrap();
        let base = data(seed ^ 1, len);
        let mut acc = base.clone();
        codec.decode_add(&wire, &mut acc).unwrap();
        for i in 0..len {
            prop_assert_eq!(acc[i].to_bits(), (base[i] + decoded[i]).to_bits(), "{} element {}", SPECS[which], i);
        }
    }

    #[test]
    fn chunks_cut_at_the_granule_encode_as_their_concatenation(
        which in 0..SPECS.len(),
        blocks in 0usize..6,
        rest in 0usize..400,
        seed in any::<u64>(),
    ) {
        let codec = compress::parse(SPECS[which]).unwrap();
        if let Some(g) = codec.granule() {
            let src = data(seed, blocks * g + rest);
            let (head, tail) = src.split_at(blocks * g);
            let mut pieces = codec.encode_to_vec(head).unwrap();
            pieces.extend(codec.encode_to_vec(tail).unwrap());
            prop_assert_eq!(pieces, codec.encode_to_vec(&src).unwrap());
        }
    }

    #[test]
    fn decoding_never_panics_on_arbitrary_bytes(
        which in 0..SPECS.len(),
        len in 0usize..300,
        seed in any::<u64>(),
    ) {
        // Any bytes of the right length either decode or are refused.
        let codec = compress::parse(SPECS[which]).unwrap();
        let mut x = seed | 1;
        let bytes: Vec<u8> = (0..codec.encoded_len(len))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut out = vec![0f32; len];
        let decoded = codec.decode(&bytes, &mut out).is_ok();
        let added = codec.decode_add(&bytes, &mut out).is_ok();
        prop_assert_eq!(decoded, added);
    }
}
