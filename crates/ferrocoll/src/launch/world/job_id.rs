//! Job ids: the launcher's made safe for file names ([`file_safe_job_id`]),
//! the check of `FERROCOLL_JOB_ID` ([`is_valid_job_id`]), and the hash
//! ([`fnv1a`]) a missing id, a long one and the derived secret are made
//! from.

/// Longest job id.
const MAX_JOB_ID: usize = 32;

/// A character a job id may hold: `[A-Za-z0-9_-]`.
fn is_job_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// A job id as `FERROCOLL_JOB_ID` must be: 1 to 32 characters of
/// `[A-Za-z0-9_-]`.
pub(super) fn is_valid_job_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_JOB_ID && id.chars().all(is_job_id_char)
}

/// A launcher's job id made safe for file names: other characters become
/// `_`; one too long keeps its first 19 characters, then `_` and 12 hex
/// digits of a hash of the whole, so distinct ids stay distinct.
pub(super) fn file_safe_job_id(id: &str) -> String {
    let safe: String = id
        .chars()
        .map(|c| if is_job_id_char(c) { c } else { '_' })
        .collect();
    if safe.len() <= MAX_JOB_ID {
        return safe;
    }
    let prefix: String = safe.chars().take(MAX_JOB_ID - 13).collect();
    format!("{prefix}_{:012x}", fnv1a(&[id]) & 0xffff_ffff_ffff)
}

/// 64-bit FNV-1a over `parts`, each followed by a 0xff byte (which UTF-8
/// never contains) so that `["ab", "c"]` and `["a", "bc"]` differ.
pub(super) fn fnv1a(parts: &[&str]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for part in parts {
        for &b in part.as_bytes().iter().chain(&[0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}
