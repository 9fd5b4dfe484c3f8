//! Checks of the store's address as the launchers' variables give it: a
//! `host:port` ([`check_addr`]), a bare host ([`check_host`], a bare IPv6
//! address bracketed) and a port ([`check_port`]), each an
//! [`Error::Config`](crate::Error::Config) naming the variable when wrong.

use super::vars::config;
use crate::error::Result;

/// Checks a `host:port` address (IPv6 as `[addr]:port`) and returns it.
pub(crate) fn check_addr(var: &str, value: &str) -> Result<String> {
    let bad = |why: &str| {
        config(
            var,
            value,
            format!(
                "{why}; set {var}=host:port with a port in 1..=65535, e.g. {var}=node01:29500 \
                 (IPv6: {var}=[::1]:29500)"
            ),
        )
    };
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| bad("no `]` after the IPv6 address"))?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| bad("no `:port` after `]`"))?;
        if host.is_empty() || !host.contains(':') {
            return Err(bad("brackets are for IPv6 addresses only"));
        }
        (host, port)
    } else {
        let (host, port) = value.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        if host.contains(':') {
            return Err(bad("an IPv6 address must be in brackets"));
        }
        (host, port)
    };
    if host.is_empty() {
        return Err(bad("no host before the port"));
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || matches!(c, '/' | '[' | ']'))
    {
        return Err(bad("the host has characters a host name cannot have"));
    }
    match port.parse::<u16>() {
        Ok(p) if p >= 1 => Ok(value.to_string()),
        _ => Err(bad("the port is not a number in 1..=65535")),
    }
}

/// Checks a bare host (`MASTER_ADDR`), bracketing a bare IPv6 address so a
/// port can follow.
pub(super) fn check_host(var: &str, value: &str) -> Result<String> {
    let bad = || {
        config(
            var,
            value,
            format!("not a host name or address; set {var} to the host of rank 0, e.g. node01"),
        )
    };
    if value.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(bad());
    }
    if let Some(inner) = value.strip_prefix('[') {
        match inner.strip_suffix(']') {
            Some(ip) if ip.contains(':') && !ip.contains(['[', ']']) => Ok(value.to_string()),
            _ => Err(bad()),
        }
    } else if value.contains(['[', ']']) {
        Err(bad())
    } else if value.contains(':') {
        Ok(format!("[{value}]"))
    } else {
        Ok(value.to_string())
    }
}

/// Checks a port number in 1..=65535.
pub(super) fn check_port(var: &str, value: &str) -> Result<u16> {
    match value.parse::<u16>() {
        Ok(p) if p >= 1 => Ok(p),
        _ => Err(config(
            var,
            value,
            format!("not a port number in 1..=65535; set {var} to a free port, e.g. 29500"),
        )),
    }
}
