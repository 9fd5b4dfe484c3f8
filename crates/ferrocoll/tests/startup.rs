//! Start-up errors that name the real cause, and the rendezvous store
//! listening where it was told. Ranks are threads calling
//! `ferrocoll::init::init_as` with a `WorldSpec` of their own (as processes
//! would, each with its own engine), with short timeouts.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use ferrocoll::init::{init_as, TransportKind};
use ferrocoll::world::Launcher;
use ferrocoll::{Config, Error, WorldSpec};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spec(rank: usize, size: usize, addr: &str) -> WorldSpec {
    WorldSpec {
        rank,
        size,
        local_rank: None,
        local_size: None,
        store_addr: addr.to_string(),
        secret: "startup-test".into(),
        job_id: format!("st{}x{}", std::process::id(), addr.len()),
        launcher: Launcher::Ferrocoll,
    }
}

fn quick() -> Config {
    Config::default().with_timeout(Duration::from_secs(1))
}

/// Ranks 0 and 2 of 3 start; rank 1 never does. Both must say that rank 1
/// did not arrive, within how long, and what to check, not blame
/// FERROCOLL_TIMEOUT, nor (rank 2) a store that went away when rank 0,
/// which serves it, gave up.
#[test]
fn a_rank_that_never_arrives_is_named() {
    let addr = format!("127.0.0.1:{}", free_port());
    let started = Instant::now();
    let errors: Vec<(usize, Error)> = std::thread::scope(|s| {
        let handles: Vec<_> = [0usize, 2]
            .into_iter()
            .map(|rank| {
                let addr = addr.clone();
                s.spawn(move || {
                    let err = init_as(&spec(rank, 3, &addr), quick(), TransportKind::Tcp)
                        .map(drop)
                        .expect_err("init cannot succeed without rank 1");
                    (rank, err)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = started.elapsed();
    for (rank, err) in errors {
        let msg = err.to_string();
        assert!(matches!(err, Error::Startup(_)), "rank {rank}: {err:?}");
        // Rank 0 serves the store: when it gives up first, the others get
        // its verdict through the store (`rank 0 of 3: ...`) rather than a
        // lost connection.
        for needle in [
            "of 3: rank 1 did not arrive",
            "within 1.",
            "every rank was started",
            "FERROCOLL_ADDR",
            &addr,
        ] {
            assert!(
                msg.contains(needle),
                "rank {rank}: `{needle}` not in: {msg}"
            );
        }
        assert!(!msg.contains("bad configuration"), "rank {rank}: {msg}");
        println!("rank {rank}: {msg}");
    }
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

/// Rank 1 of 2 alone: nobody serves the rendezvous. The error says that
/// nothing listens at the address, and what to check.
#[test]
fn an_address_nobody_listens_on_says_so() {
    let addr = format!("127.0.0.1:{}", free_port());
    let started = Instant::now();
    let err = init_as(&spec(1, 2, &addr), quick(), TransportKind::Tcp)
        .map(drop)
        .expect_err("nobody serves the store");
    let msg = err.to_string();
    for needle in [
        &format!("nothing listens at {addr}"),
        "refused",
        "rank 0 was started",
        "FERROCOLL_ADDR",
    ] {
        assert!(msg.contains(needle), "`{needle}` not in: {msg}");
    }
    println!("{msg}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// The listening sockets of this host for `port`, by local address, from
/// `/proc/net/tcp` and `/proc/net/tcp6` (state 0A is LISTEN).
fn listeners(port: u16) -> Vec<String> {
    let mut found = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 4 || fields[3] != "0A" {
                continue;
            }
            let Some((ip, p)) = fields[1].split_once(':') else {
                continue;
            };
            if u16::from_str_radix(p, 16) != Ok(port) {
                continue;
            }
            let addr = if ip.len() == 8 {
                // IPv4, in the host's (little-endian) byte order.
                let v = u32::from_str_radix(ip, 16).unwrap();
                std::net::Ipv4Addr::from(v.to_le_bytes()).to_string()
            } else {
                format!("[{ip}]")
            };
            found.push(addr);
        }
    }
    found
}

/// A store given 127.0.0.1 listens on 127.0.0.1 only, not on every
/// interface; one given a wildcard listens on every interface; one given
/// an address this host does not have fails, saying how to listen on
/// every interface (FERROCOLL_STORE_BIND), rather than silently doing so.
#[test]
fn the_store_listens_on_the_address_it_was_given() {
    if std::fs::read_to_string("/proc/net/tcp").is_err() {
        println!("no /proc/net/tcp here: skipped");
        return;
    }
    let port = free_port();
    let comm = init_as(
        &spec(0, 1, &format!("127.0.0.1:{port}")),
        quick(),
        TransportKind::Tcp,
    )
    .unwrap();
    assert_eq!(listeners(port), ["127.0.0.1"]);
    drop(comm);

    let port = free_port();
    let comm = init_as(
        &spec(0, 1, &format!("0.0.0.0:{port}")),
        quick(),
        TransportKind::Tcp,
    )
    .unwrap();
    assert_eq!(listeners(port), ["0.0.0.0"]);
    drop(comm);

    // 192.0.2.1 is TEST-NET-1: no host has it.
    let err = init_as(&spec(0, 1, "192.0.2.1:29999"), quick(), TransportKind::Tcp)
        .map(drop)
        .expect_err("no such local address");
    let msg = err.to_string();
    assert!(
        matches!(&err, Error::Config { var, .. } if var == "FERROCOLL_ADDR"),
        "{err:?}"
    );
    assert!(
        msg.contains("not an address of this host")
            && msg.contains("FERROCOLL_STORE_BIND=0.0.0.0:29999"),
        "{msg}"
    );
    assert!(listeners(29999).is_empty());
}
