//! Unit tests of the engine on hand-written plans.

use super::*;
use crate::topology::TopologySpec;
use ferrocoll::plan::{Op, Round, Span};
use state::Engine;

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
fn a_message_overhead_holds_the_senders_port_once_per_message() {
    // Rank 0 sends 3 messages of 1000 B at once: with o = 5 us on the
    // senders' ports (class `up`) they leave one after the other, each
    // after its o; without, they only queue their bytes.
    let plans = [
        plan(vec![vec![send(1, 250), send(2, 250), send(3, 250)]]),
        plan(vec![vec![recv(0, 250)]]),
        plan(vec![vec![recv(0, 250)]]),
        plan(vec![vec![recv(0, 250)]]),
    ];
    let with = SimOptions {
        message_overhead: vec![("up".into(), 5e-6)],
        ..SimOptions::default()
    };
    for mode in [Mode::Ideal, Mode::Contention] {
        let free = run(&plans, 4, &net(4), mode, &SimOptions::default()).unwrap();
        let dear = run(&plans, 4, &net(4), mode, &with).unwrap();
        let expect = 1e-6 + 3.0 * 1000.0 / 1e9;
        assert!((free.time_s - expect).abs() < 1e-12, "{mode:?} {free:?}");
        assert!(
            (dear.time_s - (expect + 3.0 * 5e-6)).abs() < 1e-12,
            "{mode:?} {dear:?}"
        );
        // The receivers' ports (class `down`) pay nothing: o on `down`
        // alone leaves the time as it was.
        let down = SimOptions {
            message_overhead: vec![("down".into(), 5e-6)],
            ..SimOptions::default()
        };
        let t = run(&plans, 4, &net(4), mode, &down).unwrap();
        assert!((t.time_s - expect).abs() < 1e-12, "{mode:?} {t:?}");
    }
    let bad = SimOptions {
        message_overhead: vec![("nic-up".into(), 5e-6)],
        ..SimOptions::default()
    };
    let e = run(&plans, 4, &net(4), Mode::Ideal, &bad).unwrap_err();
    assert!(
        e.contains("no link or link class") && e.contains("up, down"),
        "{e}"
    );
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

/// Runs `plans` on `net` in the contention mode with messages laid out on
/// their receiver's port at once or not.
fn run_laid_out(plans: &[Plan], net: &Network, lay_out: bool, sym: Option<&Symmetry>) -> Trace {
    let ranks: Vec<usize> = (0..plans.len()).collect();
    let groups = [Group {
        plans: Plans::Given(plans),
        ranks: &ranks,
    }];
    let opts = SimOptions {
        chunk_bytes: 4096,
        gamma: 1e-11,
        ..SimOptions::default()
    };
    let mut e = Engine::new(
        &groups,
        4,
        std::borrow::Cow::Borrowed(net),
        Mode::Contention,
        &opts,
        sym,
    )
    .unwrap();
    e.lay_out = lay_out;
    e.run().unwrap().remove(0)
}

#[test]
fn laying_chunks_out_at_once_changes_nothing_but_the_event_count() {
    use ferrocoll::{Algorithm, Collective};
    for (coll, algo, topo) in [
        (
            Collective::AllReduce,
            Algorithm::Butterfly,
            "switch:ranks=16,bw=50GB/s,lat=2us",
        ),
        (
            Collective::AllReduce,
            Algorithm::Tree,
            "two-level:nodes=4,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us",
        ),
        (
            Collective::AllReduce,
            Algorithm::DoubleBinaryTree,
            "fat-tree:ranks=16,leaf=4,bw=50GB/s,lat=1us,oversub=2",
        ),
        (
            Collective::AllReduce,
            Algorithm::Ring,
            "rail:nodes=4,gpus=4,intra=450GB/s@1us,inter=50GB/s@2us",
        ),
        (
            Collective::AllToAll,
            Algorithm::Pairwise,
            "two-level:nodes=4,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us",
        ),
        (
            Collective::Broadcast,
            Algorithm::Pipeline,
            "switch:ranks=9,bw=50GB/s,lat=2us",
        ),
    ] {
        let t = TopologySpec::parse(topo).unwrap();
        let n = t.ranks();
        let plans =
            crate::build_plans(coll, algo, n, crate::element_count(coll, n, 1 << 20, 4), &t)
                .unwrap();
        let net = Network::new(&t);
        let (slow, fast) = (
            run_laid_out(&plans, &net, false, None),
            run_laid_out(&plans, &net, true, None),
        );
        let what = format!("{coll} {algo} on {topo}");
        assert_eq!(slow.time_s, fast.time_s, "{what}");
        assert_eq!(slow.link_bytes, fast.link_bytes, "{what}");
        assert_eq!(slow.link_busy, fast.link_busy, "{what}");
        assert_eq!(slow.critical_path, fast.critical_path, "{what}");
        for (a, b) in slow
            .timeline
            .iter()
            .flatten()
            .zip(fast.timeline.iter().flatten())
        {
            assert!((a - b).abs() < 1e-12, "{what}: timeline {a} vs {b}");
        }
        if algo == Algorithm::Butterfly {
            assert!(fast.events * 10 < slow.events, "{what}");
        }
    }
    // The aggregated mode: a receiver's port stands for its orbit.
    let t =
        TopologySpec::parse("two-level:nodes=8,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us").unwrap();
    let net = Network::new(&t);
    let build = |r: usize| {
        crate::build_plans(Collective::AllReduce, Algorithm::Ring, 32, 1 << 18, &t)
            .map(|mut p| p.swap_remove(r))
    };
    let (sym, reps) = crate::symmetry::find(&net, &build).unwrap();
    let (slow, fast) = (
        run_laid_out(&reps, &net, false, Some(&sym)),
        run_laid_out(&reps, &net, true, Some(&sym)),
    );
    assert_eq!(slow.time_s, fast.time_s);
    assert_eq!(slow.link_busy, fast.link_busy);
    assert!(fast.events < slow.events);
}
