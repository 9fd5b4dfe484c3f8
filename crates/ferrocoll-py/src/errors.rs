//! ferrocoll's errors as Python exceptions: a base `ferrocoll.Error` (a
//! `RuntimeError`, which is what torch.distributed callers catch) and one
//! subclass per kind of [`ferrocoll::Error`], carrying the same message and,
//! where the error has them, `rank`, `peer`, `seq` and `collective`
//! attributes.

use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

create_exception!(
    _ferrocoll,
    Error,
    PyRuntimeError,
    "Base class of every ferrocoll error."
);
create_exception!(
    _ferrocoll,
    InvalidArgument,
    Error,
    "A call's arguments are wrong (lengths, root, peer, element type, ...)."
);
create_exception!(
    _ferrocoll,
    UnknownAlgorithm,
    InvalidArgument,
    "An algorithm name that the collective does not have."
);
create_exception!(
    _ferrocoll,
    ConfigError,
    Error,
    "A bad setting (an environment variable or a start-up parameter)."
);
create_exception!(
    _ferrocoll,
    Timeout,
    Error,
    "A wait passed its deadline; the message names the call and the peer."
);
create_exception!(
    _ferrocoll,
    Mismatch,
    Error,
    "Ranks called different collectives (or counts, types, roots) at the same point."
);
create_exception!(
    _ferrocoll,
    PeerLost,
    Error,
    "A rank of the communicator failed or exited."
);
create_exception!(_ferrocoll, Aborted, Error, "The communicator was aborted.");
create_exception!(
    _ferrocoll,
    Corrupted,
    Error,
    "A message's checksum did not match (FERROCOLL_CHECKSUM=1)."
);
create_exception!(
    _ferrocoll,
    StartupError,
    Error,
    "Start-up could not complete: ranks that did not arrive at the rendezvous, or a rendezvous nobody serves."
);
create_exception!(
    _ferrocoll,
    InternalError,
    Error,
    "A bug in ferrocoll; please report it."
);

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("UnknownAlgorithm", py.get_type::<UnknownAlgorithm>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("Mismatch", py.get_type::<Mismatch>())?;
    m.add("PeerLost", py.get_type::<PeerLost>())?;
    m.add("Aborted", py.get_type::<Aborted>())?;
    m.add("Corrupted", py.get_type::<Corrupted>())?;
    m.add("StartupError", py.get_type::<StartupError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    Ok(())
}

/// The Python exception for `e`, with its fields as attributes.
pub fn to_py(py: Python<'_>, e: &ferrocoll::Error) -> PyErr {
    use ferrocoll::Error as E;
    let msg = e.to_string();
    let err = match e {
        E::InvalidArgument(_) => InvalidArgument::new_err(msg),
        E::UnknownAlgorithm { .. } => UnknownAlgorithm::new_err(msg),
        E::Config { .. } => ConfigError::new_err(msg),
        // torch's tests and tools recognise a timeout by " Timed out " in
        // the message: say it too, after ferrocoll's own words.
        E::Timeout { waited, .. } => {
            Timeout::new_err(format!("{msg} (ferrocoll: Timed out after {waited:?})"))
        }
        E::Mismatch { .. } => Mismatch::new_err(msg),
        E::PeerLost { .. } => PeerLost::new_err(msg),
        E::Aborted => Aborted::new_err(msg),
        E::Corrupted { .. } => Corrupted::new_err(msg),
        E::Startup(_) => StartupError::new_err(msg),
        _ => InternalError::new_err(msg),
    };
    let value = err.value(py);
    // Attributes are a convenience: a failure to set one leaves the message.
    let _ = match e {
        E::Timeout {
            collective,
            seq,
            rank,
            peer,
            ..
        } => value
            .setattr("collective", collective)
            .and_then(|_| value.setattr("seq", *seq))
            .and_then(|_| value.setattr("rank", *rank))
            .and_then(|_| value.setattr("peer", *peer)),
        E::Mismatch { rank, peer, .. } => value
            .setattr("rank", *rank)
            .and_then(|_| value.setattr("peer", *peer)),
        E::PeerLost { rank } => value.setattr("peer", *rank),
        E::Corrupted {
            rank,
            peer,
            collective,
        } => value
            .setattr("rank", *rank)
            .and_then(|_| value.setattr("peer", *peer))
            .and_then(|_| value.setattr("collective", collective)),
        _ => Ok(()),
    };
    err
}
