//! Reading the launchers' variables: [`Env`], a lookup where an empty value
//! counts as unset, numbers that remember the variable they came from
//! ([`Named`]), what one family found ([`Found`]) and the
//! [`Error::Config`] naming a variable ([`config`]).

use super::launcher::Launcher;
use crate::error::{Error, Result};

/// Variable lookup where empty (or all-space) values count as unset.
pub(super) struct Env<'a> {
    /// The lookup underneath: the process environment, or what the
    /// caller gave [`WorldSpec::from_vars`](super::WorldSpec::from_vars).
    pub(super) get: &'a dyn Fn(&str) -> Option<String>,
}

impl Env<'_> {
    /// The trimmed value of `name`, `None` when unset or empty.
    pub(super) fn get(&self, name: &str) -> Option<String> {
        (self.get)(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// `name` parsed as a count or index, `None` when unset.
    pub(super) fn usize(&self, name: &'static str) -> Result<Option<Named>> {
        match self.get(name) {
            None => Ok(None),
            Some(value) => match value.parse::<usize>() {
                Ok(n) => Ok(Some(Named {
                    value: n,
                    var: name,
                })),
                Err(_) => Err(config(
                    name,
                    &value,
                    format!(
                        "{}: not a non-negative integer; set {name} to a whole number such as 0 \
                         or 4",
                        crate::env::not_whole(&value)
                    ),
                )),
            },
        }
    }

    /// `name` parsed as a count or index; `missing` explains what to set
    /// when it is unset.
    pub(super) fn require_usize(&self, name: &'static str, missing: &str) -> Result<Named> {
        self.usize(name)?.ok_or_else(|| Error::invalid(missing))
    }
}

/// A number and the variable it came from (for error messages).
#[derive(Clone, Copy, Debug)]
pub(super) struct Named {
    /// The number.
    pub(super) value: usize,
    /// The variable it was read from.
    pub(super) var: &'static str,
}

/// What one family found, before the shared checks and derivations.
pub(super) struct Found {
    /// The family's launcher.
    pub(super) launcher: Launcher,
    /// This process's rank.
    pub(super) rank: Named,
    /// The number of ranks.
    pub(super) size: Named,
    /// The rank on this host, when the family gives it.
    pub(super) local_rank: Option<Named>,
    /// The ranks on this host, when the family gives it.
    pub(super) local_size: Option<Named>,
    /// The store's `host:port`, checked.
    pub(super) store_addr: String,
    /// From the launcher, not yet made file-name safe.
    pub(super) job_id: Option<String>,
}

/// The [`Error::Config`] for `var` set to `value`, with `reason` saying
/// what is wrong and what to set.
pub(super) fn config(var: &str, value: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        var: var.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}
