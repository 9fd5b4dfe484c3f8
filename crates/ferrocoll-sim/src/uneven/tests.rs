//! Unit tests: the exact link bytes against full runs link by link, and
//! plans the model refuses.

use ferrocoll::plan::{Op, Plan, Round, Span};
use ferrocoll::{Algorithm, Collective};

use super::*;
use crate::topology::TopologySpec;
use crate::{build_plans, element_count};

#[test]
fn every_links_bytes_are_the_full_runs() {
    use Algorithm::*;
    use Collective::*;
    for (algo, elements, topo) in [
        (Ring, 1001, "switch:ranks=12,bw=50GB/s,lat=2us"),
        (
            Ring,
            1001,
            "fat-tree:ranks=16,leaf=4,bw=50GB/s,lat=1us,oversub=2",
        ),
        (
            Direct,
            2003,
            "fat-tree:ranks=16,leaf=4,bw=50GB/s,lat=1us,oversub=2",
        ),
        (
            Hier,
            4099,
            "two-level:nodes=4,gpus=4,intra=450GB/s@1us,inter=25GB/s@2us",
        ),
        (
            Hier,
            1003,
            "rail:nodes=4,gpus=4,intra=450GB/s@1us,inter=50GB/s@2us",
        ),
        (Ring2, 997, "ring:ranks=8,bw=50GB/s,lat=1us"),
        (Torus2d, 1001, "torus:dims=4x4,bw=50GB/s,lat=1us"),
    ] {
        let t = TopologySpec::parse(topo).unwrap();
        let n = t.ranks();
        let count = element_count(AllReduce, n, elements * 4, 4);
        let plans = build_plans(AllReduce, algo, n, count, &t).unwrap();
        let net = Network::new(&t);
        let full = engine::run(&plans, 4, &net, Mode::Contention, &SimOptions::default()).unwrap();
        let build = |r: usize| Ok(plans[r].clone());
        let model = find(&net, &build)
            .unwrap()
            .unwrap_or_else(|| panic!("{algo} on {topo}: no shape"));
        assert_eq!(
            account::link_bytes(&model, &net, 4),
            full.link_bytes,
            "{algo} on {topo}"
        );
        assert!(model.blocks.sizes().len() >= 2, "{algo} on {topo}");
    }
}

fn plan(ops: Vec<Op>) -> Plan {
    Plan {
        rounds: vec![Round { ops }],
        scratch: 0,
    }
}

/// A ring step on `n` ranks in which rank r sends `len(r)` elements at
/// `offset(r)` of its output to r + 1.
fn step(n: usize, r: usize, offset: usize, len: usize, recv: usize) -> Plan {
    plan(vec![
        Op::Send {
            peer: (r + 1) % n,
            src: Span::output(offset, len),
        },
        Op::Recv {
            peer: (r + n - 1) % n,
            dst: Span::output(0, recv),
        },
    ])
}

#[test]
fn sizes_that_no_block_map_explains_are_refused() {
    let net = Network::new(&TopologySpec::parse("switch:ranks=4,bw=1GB/s,lat=1us").unwrap());
    // Every rank sends elements 0..len of its output, rank 2 one more:
    // block 0 maps to itself, so the model has every rank send 1.
    let lens = [1, 1, 2, 1];
    let build = |r: usize| Ok(step(4, r, 0, lens[r], lens[(r + 3) % 4]));
    let e = find(&net, &build).err().expect("refused");
    assert!(
        e.contains("rank 2's op 0") && e.contains("moves 2 elements"),
        "{e}"
    );
    // Rank r sends block r (elements r..r+1), but rank 0 alone never shows
    // where block 1 goes.
    let net3 = Network::new(&TopologySpec::parse("switch:ranks=3,bw=1GB/s,lat=1us").unwrap());
    let build = |r: usize| Ok(step(3, r, r, 1, 1));
    let e = find(&net3, &build).err().expect("refused");
    assert!(e.contains("no representative touches"), "{e}");
    // Plans of different shapes are not this module's to model.
    let build = |r: usize| {
        Ok(if r == 1 {
            plan(vec![])
        } else {
            step(4, r, 0, 1, 1)
        })
    };
    assert!(find(&net, &build).unwrap().is_none());
}
