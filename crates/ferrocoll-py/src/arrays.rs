//! numpy arrays read through numpy's array interface struct
//! (`__array_struct__`, a capsule holding a `PyArrayInterface`): the data
//! address, element type, length and flags of an array in ~40 ns, where the
//! `__array_interface__` dictionary takes ~1 µs to build. The struct is part
//! of numpy's documented interface (it is what the buffer protocol was
//! modelled on), so any array-like that offers it works.

use std::ffi::c_void;

use ferrocoll::DType;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};

use crate::errors::InvalidArgument;
use crate::jobs::Buf;

/// numpy's `PyArrayInterface` (numpy/ndarraytypes.h), field for field.
#[repr(C)]
struct ArrayInterface {
    two: i32,
    nd: i32,
    typekind: u8,
    itemsize: i32,
    flags: i32,
    shape: *const isize,
    strides: *const isize,
    data: *mut c_void,
    descr: *mut c_void,
}

const C_CONTIGUOUS: i32 = 0x0001;
const ALIGNED: i32 = 0x0100;
const WRITEABLE: i32 = 0x0400;

/// An array as a call sees it: where, how long, of what.
pub struct Array {
    pub buf: Buf,
    pub dtype: DType,
    /// numpy's bool (reduced as 0/1 with max for sum and min for product).
    pub is_bool: bool,
}

fn type_name(kind: u8, size: i32) -> String {
    match (kind, size) {
        (b'c', 8) => "complex64".into(),
        (b'c', 16) => "complex128".into(),
        (b'f', s) => format!("float{}", s * 8),
        (b'i', s) => format!("int{}", s * 8),
        (b'u', s) => format!("uint{}", s * 8),
        (k, s) => format!("{}{s}", k as char),
    }
}

/// Reads `obj`'s array struct; `what` names it in errors.
pub fn read(obj: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<Array> {
    let py = obj.py();
    let capsule = obj.getattr(intern!(py, "__array_struct__"))?;
    let capsule = capsule.cast::<PyCapsule>().map_err(PyErr::from)?;
    let ptr = capsule.pointer_checked(None)?;
    // SAFETY: numpy's capsule holds a PyArrayInterface that lives as long as
    // the capsule, which `capsule` keeps alive while the fields are read;
    // `two == 2` is numpy's check that the struct is what it claims.
    let (array, len) = unsafe {
        let a = &*(ptr.as_ptr() as *const ArrayInterface);
        if a.two != 2 {
            return Err(InvalidArgument::new_err(format!(
                "{what}: __array_struct__ is not a numpy array interface"
            )));
        }
        let dims = std::slice::from_raw_parts(a.shape, a.nd.max(0) as usize);
        let len = dims.iter().map(|&d| d.max(0) as usize).product::<usize>();
        (
            (a.typekind, a.itemsize, a.flags, a.data as usize, a.strides),
            len,
        )
    };
    let (kind, itemsize, flags, addr, _) = array;
    if flags & C_CONTIGUOUS == 0 {
        return Err(InvalidArgument::new_err(format!(
            "{what} is not contiguous; pass np.ascontiguousarray(...) (and copy results back \
             yourself): ferrocoll reads and writes buffers in place"
        )));
    }
    if writable && flags & WRITEABLE == 0 {
        return Err(InvalidArgument::new_err(format!(
            "{what} is read-only but the call writes into it"
        )));
    }
    if flags & ALIGNED == 0 && len > 0 {
        return Err(InvalidArgument::new_err(format!(
            "{what} is not aligned to its elements; copy it into a fresh array"
        )));
    }
    let dtype = match (kind, itemsize) {
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (b'f', 2) => DType::F16,
        (b'i', 1) => DType::I8,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'u', 1) | (b'b', 1) => DType::U8,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        // ml_dtypes' bfloat16 is a 2-byte 'V' (void) kind named bfloat16.
        (b'V', 2) if descr_name(obj).as_deref() == Some("bfloat16") => DType::BF16,
        (k, s) => {
            return Err(InvalidArgument::new_err(format!(
                "element type {} is not one ferrocoll reduces; use one of float32, float64, \
                 float16, bfloat16, int8, uint8, int32, int64, uint32, uint64",
                type_name(k, s)
            )))
        }
    };
    Ok(Array {
        buf: Buf { addr, len },
        dtype,
        is_bool: kind == b'b',
    })
}

fn descr_name(obj: &Bound<'_, PyAny>) -> Option<String> {
    obj.getattr("dtype")
        .ok()?
        .getattr("name")
        .ok()?
        .extract()
        .ok()
}
