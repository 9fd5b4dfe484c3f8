//! Unit tests of the engine on hand-written plans.

use super::*;
use crate::topology::TopologySpec;
use ferrocoll::plan::{Op, Round, Span};

fn plan(ops: Vec<Vec<Op>>) -> Plan {
    Plan {
        rounds: ops.into_iter().map(|ops| Round { ops }).collect(),
        scratch: 0,
    }
}

fn net(n: usize) -> Network {
    Network::new(&TopologySpec::parse(&format!("switch:ranks={n},bw=1GB/s,lat=1us")).unwrap())
}

fn send(peer: usize, len: usize) -> Op {
    Op::Send {
        peer,
        src: Span::input(0, len),
    }
}

fn recv(peer: usize, len: usize) -> Op {
    Op::Recv {
        peer,
        dst: Span::output(0, len),
    }
}

#[test]
fn one_message_costs_latency_plus_bytes_over_bandwidth() {
    let plans = [
        plan(vec![vec![send(1, 250)]]),
        plan(vec![vec![recv(0, 250)]]),
    ];
    for mode in [Mode::Ideal, Mode::Contention] {
        let t = run(&plans, 4, &net(2), mode, &SimOptions::default()).unwrap();
        assert!(
            (t.time_s - (1e-6 + 1000.0 / 1e9)).abs() < 1e-15,
            "{mode:?} {t:?}"
        );
        assert_eq!(t.link_bytes, [1000, 0, 0, 1000]);
    }
}

#[test]
fn a_one_link_path_is_charged_once() {
    // Neighbours on a physical ring share one link: no separate ports.
    let ring = TopologySpec::parse("ring:ranks=4,bw=1GB/s,lat=1us").unwrap();
    let net = Network::new(&ring);
    assert_eq!(net.path(0, 1).links().len(), 1);
    let plans = [
        plan(vec![vec![send(1, 250)]]),
        plan(vec![vec![recv(0, 250)]]),
        plan(vec![]),
        plan(vec![]),
    ];
    for mode in [Mode::Ideal, Mode::Contention] {
        let t = run(&plans, 4, &net, mode, &SimOptions::default()).unwrap();
        assert!(
            (t.time_s - (1e-6 + 1000.0 / 1e9)).abs() < 1e-15,
            "{mode:?} {t:?}"
        );
    }
}

#[test]
fn rendezvous_waits_for_the_later_end() {
    // Rank 1 first receives 1000 bytes from rank 2 (2 us), then from rank 0.
    let plans = [
        plan(vec![vec![send(1, 250)]]),
        plan(vec![vec![recv(2, 250)], vec![recv(0, 250)]]),
        plan(vec![vec![send(1, 250)]]),
    ];
    let t = run(&plans, 4, &net(3), Mode::Ideal, &SimOptions::default()).unwrap();
    assert!((t.time_s - 4e-6).abs() < 1e-15, "{t:?}");
}

#[test]
fn plans_that_do_not_fit_are_errors() {
    let opts = SimOptions::default();
    let lonely = [plan(vec![vec![send(1, 1)]]), plan(vec![])];
    let e = run(&lonely, 4, &net(2), Mode::Ideal, &opts).unwrap_err();
    assert!(e.contains("never received"), "{e}");
    let waiting = [plan(vec![]), plan(vec![vec![recv(0, 1)]])];
    let e = run(&waiting, 4, &net(2), Mode::Ideal, &opts).unwrap_err();
    assert!(e.contains("never sent"), "{e}");
    let sizes = [plan(vec![vec![send(1, 2)]]), plan(vec![vec![recv(0, 1)]])];
    let e = run(&sizes, 4, &net(2), Mode::Ideal, &opts).unwrap_err();
    assert!(e.contains("bytes"), "{e}");
    // Each waits for the other's second round first.
    let crossed = [
        plan(vec![vec![recv(1, 1)], vec![send(1, 1)]]),
        plan(vec![vec![recv(0, 1)], vec![send(0, 1)]]),
    ];
    let e = run(&crossed, 4, &net(2), Mode::Contention, &opts).unwrap_err();
    assert!(e.contains("deadlock"), "{e}");
    let e = run(&crossed, 4, &net(3), Mode::Ideal, &opts).unwrap_err();
    assert!(e.contains("network of 3"), "{e}");
    let outside = [plan(vec![vec![send(5, 1)]]), plan(vec![])];
    assert!(run(&outside, 4, &net(2), Mode::Ideal, &opts).is_err());
}
