//! The store's tests: protocol, server and client together.

use super::client::*;
use super::server::*;
use super::*;
use std::sync::mpsc;

const SECRET: &str = "s3cret";

fn server() -> StoreServer {
    StoreServer::start("127.0.0.1:0", SECRET).unwrap()
}

fn client(s: &StoreServer, timeout_ms: u64) -> StoreClient {
    StoreClient::connect(
        &s.local_addr().to_string(),
        SECRET,
        Duration::from_millis(timeout_ms),
    )
    .unwrap()
}

#[test]
fn set_get_delete() {
    let s = server();
    let mut c = client(&s, 2000);
    assert_eq!(c.get("a").unwrap(), None);
    c.set("a", b"hello").unwrap();
    c.set("empty", b"").unwrap();
    assert_eq!(c.get("a").unwrap(), Some(b"hello".to_vec()));
    assert_eq!(c.get("empty").unwrap(), Some(Vec::new()));
    c.set("a", b"again").unwrap();
    assert_eq!(c.get("a").unwrap(), Some(b"again".to_vec()));
    c.delete("a").unwrap();
    c.delete("a").unwrap(); // absent: no error
    assert_eq!(c.get("a").unwrap(), None);
    // Another client sees the same map.
    let mut other = client(&s, 2000);
    assert_eq!(other.get("empty").unwrap(), Some(Vec::new()));
}

#[test]
fn limits_are_invalid_arguments() {
    let s = server();
    let mut c = client(&s, 2000);
    let long = "k".repeat(MAX_KEY_LEN + 1);
    assert!(matches!(c.set(&long, b"x"), Err(Error::InvalidArgument(_))));
    assert!(matches!(c.get(&long), Err(Error::InvalidArgument(_))));
    let big = vec![0u8; MAX_VALUE_LEN + 1];
    assert!(matches!(c.set("k", &big), Err(Error::InvalidArgument(_))));
    // The connection is still fine.
    c.set("k", b"v").unwrap();
    assert_eq!(c.get("k").unwrap(), Some(b"v".to_vec()));
}

#[test]
fn wait_blocks_until_set_and_keeps_order() {
    let s = server();
    let addr = s.local_addr().to_string();
    let mut c = client(&s, 2000);
    c.set("b", b"2").unwrap();
    let setter = thread::spawn(move || {
        let mut c = StoreClient::connect(&addr, SECRET, Duration::from_secs(2)).unwrap();
        thread::sleep(Duration::from_millis(100));
        c.set("a", b"1").unwrap();
        thread::sleep(Duration::from_millis(50));
        c.set("c", b"3").unwrap();
    });
    // A waiting client must not hold up others.
    let mut third = client(&s, 2000);
    let start = Instant::now();
    let values = c.wait(&["c", "a", "b"]).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert_eq!(values, vec![b"3".to_vec(), b"1".to_vec(), b"2".to_vec()]);
    third.set("d", b"4").unwrap();
    setter.join().unwrap();
    assert_eq!(c.wait(&[]).unwrap(), Vec::<Vec<u8>>::new());
}

#[test]
fn wait_does_not_block_other_clients() {
    let s = server();
    let addr = s.local_addr().to_string();
    let waiter = thread::spawn(move || {
        let mut c = StoreClient::connect(&addr, SECRET, Duration::from_secs(2)).unwrap();
        c.wait(&["late"]).unwrap()
    });
    thread::sleep(Duration::from_millis(50));
    let mut c = client(&s, 2000);
    let start = Instant::now();
    c.set("x", b"1").unwrap();
    assert_eq!(c.get("x").unwrap(), Some(b"1".to_vec()));
    assert!(start.elapsed() < Duration::from_millis(500));
    c.set("late", b"now").unwrap();
    assert_eq!(waiter.join().unwrap(), vec![b"now".to_vec()]);
}

#[test]
fn wait_timeout_names_the_key() {
    let s = server();
    let mut c = client(&s, 200);
    c.set("present", b"x").unwrap();
    let start = Instant::now();
    let err = c.wait(&["present", "missing/key"]).unwrap_err();
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(190), "{waited:?}");
    assert!(waited < Duration::from_millis(1500), "{waited:?}");
    let msg = err.to_string();
    assert!(matches!(err, Error::Config { ref var, .. } if var == "FERROCOLL_TIMEOUT"));
    assert!(msg.contains("missing/key"), "{msg}");
    assert!(msg.contains(&s.local_addr().to_string()), "{msg}");
    // The connection stays usable after a timeout.
    c.set_timeout(Duration::from_secs(2));
    assert_eq!(c.get("present").unwrap(), Some(b"x".to_vec()));
}

#[test]
fn add_from_many_threads() {
    let s = server();
    let addr = s.local_addr().to_string();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let addr = addr.clone();
            thread::spawn(move || {
                let mut c = StoreClient::connect(&addr, SECRET, Duration::from_secs(2)).unwrap();
                let mut last = 0;
                for _ in 0..100 {
                    let v = c.add("counter", 1).unwrap();
                    assert!(v > last);
                    last = v;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut c = client(&s, 2000);
    assert_eq!(c.add("counter", 0).unwrap(), 800);
    assert_eq!(c.get("counter").unwrap(), Some(b"800".to_vec()));
    assert_eq!(c.add("neg", -5).unwrap(), -5);
    c.set("text", b"abc").unwrap();
    let err = c.add("text", 1).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("text"));
    // Still in step after the error.
    assert_eq!(c.add("counter", 1).unwrap(), 801);
}

#[test]
fn barrier_with_five_clients() {
    let s = server();
    let addr = s.local_addr().to_string();
    let threads: Vec<_> = (0..5)
        .map(|i| {
            let addr = addr.clone();
            thread::spawn(move || {
                let mut c = StoreClient::connect(&addr, SECRET, Duration::from_secs(2)).unwrap();
                thread::sleep(Duration::from_millis(20 * i));
                c.set(&format!("arrived/{i}"), b"1").unwrap();
                c.barrier("b0", 5).unwrap();
                for j in 0..5 {
                    assert!(c.get(&format!("arrived/{j}")).unwrap().is_some());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // A barrier short of participants times out and says how many came.
    let mut c = client(&s, 200);
    let msg = c.barrier("b1", 2).unwrap_err().to_string();
    assert!(msg.contains("1 of 2"), "{msg}");
    assert!(msg.contains("b1/done"), "{msg}");
}

#[test]
fn wrong_secret_is_rejected() {
    let s = server();
    let addr = s.local_addr().to_string();
    let start = Instant::now();
    let err = StoreClient::connect(&addr, "xyzzy-42", Duration::from_secs(2)).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "no retry on a rejection"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "the store at {addr} rejected our secret: this process belongs to another job, \
                 or FERROCOLL_SECRET differs between ranks"
        )),
        "{msg}"
    );
    assert!(!msg.contains("xyzzy"), "the secret must not leak: {msg}");
    // A prefix of the secret is not the secret.
    assert!(StoreClient::connect(&addr, "s3cr", Duration::from_secs(1)).is_err());
    assert!(StoreClient::connect(&addr, "s3crets", Duration::from_secs(1)).is_err());
    client(&s, 2000).set("k", b"v").unwrap();
}

#[test]
fn garbage_does_not_kill_the_server() {
    let s = server();
    let addr = s.local_addr();
    // Something speaking HTTP: its first "length" is huge.
    let mut http = TcpStream::connect(addr).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    // A small frame without the magic.
    let mut wrong = TcpStream::connect(addr).unwrap();
    wrong
        .write_all(&Enc::new(8).raw(b"XXXX").u32(1).finish())
        .unwrap();
    for mut g in [http, wrong] {
        g.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 16];
        // Closed without a reply (EOF or reset).
        assert!(matches!(g.read(&mut buf), Ok(0) | Err(_)));
    }
    // An authenticated client breaking the protocol is closed too.
    let mut c = client(&s, 2000);
    let bad = Enc::new(1).u8(99).finish();
    assert!(c.call("bogus", "k", &bad, Duration::ZERO).is_err());
    // One that connects and says nothing holds up nobody.
    let _silent = TcpStream::connect(addr).unwrap();
    let mut good = client(&s, 2000);
    good.set("k", b"v").unwrap();
    assert_eq!(good.get("k").unwrap(), Some(b"v".to_vec()));
    // The client that broke the protocol reconnects on its next call.
    assert_eq!(c.get("k").unwrap(), Some(b"v".to_vec()));
}

#[test]
fn connect_retries_until_the_server_starts() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let (tx, rx) = mpsc::channel();
    let server_addr = addr.clone();
    let starter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        let s = StoreServer::start(&server_addr, SECRET).unwrap();
        tx.send(()).unwrap();
        s
    });
    let start = Instant::now();
    let mut c = StoreClient::connect(&addr, SECRET, Duration::from_secs(3)).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(250));
    rx.recv().unwrap();
    let s = starter.join().unwrap();
    assert_eq!(s.local_addr().port(), port);
    c.set("k", b"v").unwrap();
    assert_eq!(c.get("k").unwrap(), Some(b"v".to_vec()));
}

#[test]
fn connect_gives_up_after_the_timeout() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let start = Instant::now();
    let err = StoreClient::connect(&addr, SECRET, Duration::from_millis(300)).unwrap_err();
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(290) && waited < Duration::from_secs(2));
    let msg = err.to_string();
    assert!(
        msg.contains("FERROCOLL_ADDR") && msg.contains(&addr),
        "{msg}"
    );
    // Nobody listens there: the message says so, and what to check.
    assert!(msg.contains("nothing listens at"), "{msg}");
    assert!(msg.contains("rank 0 was started"), "{msg}");
}

#[test]
fn server_drop_does_not_hang_and_clients_error() {
    let s = server();
    let addr = s.local_addr().to_string();
    let mut c = client(&s, 2000);
    c.set("k", b"v").unwrap();
    let waiter = {
        let addr = addr.clone();
        thread::spawn(move || {
            let mut c = StoreClient::connect(&addr, SECRET, Duration::from_secs(10)).unwrap();
            c.wait(&["never"])
        })
    };
    let _silent = TcpStream::connect(&addr).unwrap();
    thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    drop(s);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    let err = waiter.join().unwrap().unwrap_err();
    assert!(err.to_string().contains(&addr), "{err}");
    assert!(start.elapsed() < Duration::from_secs(1));
    let err = c.get("k").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&addr) && msg.contains("`k`"), "{msg}");
    // And the next call fails fast too (the reconnect is refused).
    assert!(c.set("k", b"v").is_err());
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn secrets_compare_whole() {
    assert!(secrets_match(b"abc", b"abc"));
    assert!(secrets_match(b"", b""));
    assert!(!secrets_match(b"abc", b"abd"));
    assert!(!secrets_match(b"abc", b"ab"));
    assert!(!secrets_match(b"", b"a"));
}

#[test]
fn fail_waits_answers_every_waiter_with_the_reason() {
    let s = server();
    let addr = s.local_addr().to_string();
    let waiter = thread::spawn(move || {
        let mut c = StoreClient::connect(&addr, SECRET, Duration::from_secs(10)).unwrap();
        let start = Instant::now();
        (c.wait(&["never"]), start.elapsed())
    });
    thread::sleep(Duration::from_millis(100));
    s.fail_waits("rank 1 did not arrive");
    let (got, waited) = waiter.join().unwrap();
    assert_eq!(got, Err(Error::Startup("rank 1 did not arrive".into())));
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    // Later waits fail at once the same way; other requests still work.
    let mut c = client(&s, 2000);
    c.set("k", b"v").unwrap();
    assert!(matches!(c.wait(&["k"]), Err(Error::Startup(_))));
    assert_eq!(c.get("k").unwrap(), Some(b"v".to_vec()));
}
