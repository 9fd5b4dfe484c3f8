//! Element types and reduction operators.
//!
//! A collective moves and combines typed elements. The executor works on
//! bytes (plans are type-agnostic), so each element type has a runtime tag,
//! [`DType`], and the typed API is tied to it by the [`Element`] trait.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

use crate::error::Error;

/// Runtime tag of an element type, as carried in plans, message signatures
/// and benchmark output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// IEEE 754 binary16 (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    BF16,
    /// Signed 8-bit integer.
    I8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
}

impl DType {
    /// Every supported element type, in a stable order.
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U32,
        DType::U64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The short name used on the command line and in JSON (`float`, `half`, ...
    /// as nccl-tests prints them would be ambiguous; we use Rust's names).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::U64 => "u64",
        }
    }

    /// True for the floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let lower = s.to_ascii_lowercase();
        let found = match lower.as_str() {
            "float" | "float32" => Some(DType::F32),
            "double" | "float64" => Some(DType::F64),
            "half" | "float16" => Some(DType::F16),
            "bfloat16" => Some(DType::BF16),
            "int8" => Some(DType::I8),
            "int32" | "int" => Some(DType::I32),
            "int64" => Some(DType::I64),
            "uint8" => Some(DType::U8),
            "uint32" => Some(DType::U32),
            "uint64" => Some(DType::U64),
            other => DType::ALL.into_iter().find(|d| d.name() == other),
        };
        found.ok_or_else(|| {
            Error::invalid(format!(
                "unknown element type `{s}`; use one of: {}",
                DType::ALL.map(|d| d.name()).join(", ")
            ))
        })
    }
}

/// How a reduction combines elements.
///
/// `Avg` is a sum followed by a division by the group size, as NCCL's
/// `ncclAvg`: for integers the division truncates toward zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Elementwise sum (integers wrap on overflow).
    Sum,
    /// Elementwise product (integers wrap on overflow).
    Prod,
    /// Elementwise minimum.
    Min,
    /// Elementwise maximum.
    Max,
    /// Sum divided by the number of ranks.
    Avg,
}

impl ReduceOp {
    /// Every operator, in a stable order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The name used on the command line and in JSON.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// The operator the data movement uses: `Avg` travels as `Sum` and is
    /// divided once at the end, so partial results stay exact.
    pub const fn combining(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            op => op,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let lower = s.to_ascii_lowercase();
        ReduceOp::ALL
            .into_iter()
            .find(|op| op.name() == lower)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown reduction `{s}`; use one of: {}",
                    ReduceOp::ALL.map(|o| o.name()).join(", ")
                ))
            })
    }
}

/// An element type ferrocoll can move and reduce.
///
/// Implemented for `f32, f64, half::f16, half::bf16, i8, i32, i64, u8, u32,
/// u64`. The trait is sealed: the executor relies on [`Element::DTYPE`]
/// describing the memory layout exactly.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + sealed::Sealed {
    /// The runtime tag of this type.
    const DTYPE: DType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element!(
    f32 => F32, f64 => F64, f16 => F16, bf16 => BF16,
    i8 => I8, i32 => I32, i64 => I64, u8 => U8, u32 => U32, u64 => U64,
);
