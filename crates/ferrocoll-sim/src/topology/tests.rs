//! Unit tests of the topology strings.

use super::*;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

#[test]
fn units_convert() {
    assert!(close(parse_bandwidth("50GB/s").unwrap(), 5e10));
    assert!(close(parse_bandwidth("400Gb/s").unwrap(), 5e10));
    assert!(close(parse_bandwidth("1.5TB/s").unwrap(), 1.5e12));
    assert!(close(parse_bandwidth("100MB/s").unwrap(), 1e8));
    assert!(close(parse_bandwidth("8b/s").unwrap(), 1.0));
    assert!(close(parse_latency("2us").unwrap(), 2e-6));
    assert!(close(parse_latency("500ns").unwrap(), 5e-7));
    assert!(close(parse_latency("1.5ms").unwrap(), 1.5e-3));
    assert!(close(parse_latency("0s").unwrap(), 0.0));
    for bad in [
        "50", "50GB", "GB/s", "50XB/s", "-1GB/s", "0GB/s", "50 GiB/s", "5µB/s",
    ] {
        assert!(parse_bandwidth(bad).is_err(), "{bad}");
    }
    for bad in ["2", "2 sec", "us", "-1us", "2mus"] {
        assert!(parse_latency(bad).is_err(), "{bad}");
    }
}

#[test]
fn parses_the_three_kinds() {
    let s = TopologySpec::parse("switch:ranks=64,bw=50GB/s,lat=2us").unwrap();
    assert_eq!(
        s,
        TopologySpec::Switch {
            ranks: 64,
            link: LinkSpec {
                bw: 5e10,
                lat: 2e-6
            },
            sharp: false,
            placement: Placement::Block,
        }
    );
    assert_eq!(s.ranks(), 64);
    let t = TopologySpec::parse("two-level:nodes=4,gpus=8,intra=450GB/s@1us,inter=200Gb/s@2us")
        .unwrap();
    match t {
        TopologySpec::TwoLevel {
            nodes,
            gpus,
            intra,
            inter,
            ..
        } => {
            assert_eq!((nodes, gpus), (4, 8));
            assert!(close(intra.bw, 4.5e11) && close(intra.lat, 1e-6));
            assert!(close(inter.bw, 2.5e10) && close(inter.lat, 2e-6));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(t.ranks(), 32);
    assert_eq!(t.plan_topology().levels(), &[4, 8]);
    let f = TopologySpec::parse("fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=2").unwrap();
    assert_eq!(
        f,
        TopologySpec::FatTree {
            ranks: 64,
            leaf: 8,
            link: LinkSpec {
                bw: 5e10,
                lat: 1e-6
            },
            oversub: 2.0,
            sharp: false,
            placement: Placement::Block,
        }
    );
    // oversub defaults to 1; spaces and field order do not matter.
    let g = TopologySpec::parse(" fat-tree: lat=1us, bw=50GB/s, leaf=8, ranks=16 ").unwrap();
    assert!(matches!(g, TopologySpec::FatTree { oversub, .. } if oversub == 1.0));
}

#[test]
fn display_round_trips() {
    for s in [
        "switch:ranks=64,bw=50GB/s,lat=2us",
        "two-level:nodes=4,gpus=8,intra=450GB/s@1us,inter=25GB/s@2us",
        "fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=2",
        "switch:ranks=64,bw=50GB/s,lat=1us,sharp=1",
        "fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=2,sharp=1,placement=roundrobin",
    ] {
        let t = TopologySpec::parse(s).unwrap();
        assert_eq!(t.to_string(), s);
        assert_eq!(TopologySpec::parse(&t.to_string()).unwrap(), t);
    }
}

#[test]
fn errors_name_the_field() {
    let err = |s: &str| TopologySpec::parse(s).unwrap_err();
    assert!(err("mesh:ranks=4").contains("kind `mesh`"));
    assert!(err("switch").contains("kind:key=value"));
    assert!(err("switch:ranks=64,bw=50GB/s").contains("missing field `lat`"));
    assert!(err("switch:ranks=64,bw=50XB/s,lat=1us").contains("bw:"));
    assert!(err("switch:ranks=64,bw=50GB/s,lat=1").contains("lat:"));
    assert!(err("switch:ranks=0,bw=50GB/s,lat=1us").contains("ranks:"));
    assert!(err("switch:ranks=many,bw=50GB/s,lat=1us").contains("ranks:"));
    assert!(err("switch:ranks=4,ranks=4,bw=50GB/s,lat=1us").contains("twice"));
    assert!(err("switch:ranks=4,bw=50GB/s,lat=1us,leaf=2").contains("unknown field `leaf`"));
    assert!(err("switch:ranks=4,bw50GB/s,lat=1us").contains("key=value"));
    assert!(err("two-level:nodes=2,gpus=4,intra=450GB/s,inter=25GB/s@2us").contains("intra:"));
    assert!(err("two-level:nodes=2,gpus=4,intra=450GB/s@1us,inter=25GB/s@2").contains("inter:"));
    assert!(err("fat-tree:ranks=60,leaf=8,bw=50GB/s,lat=1us").contains("leaf:"));
    assert!(err("fat-tree:ranks=64,leaf=8,bw=50GB/s,lat=1us,oversub=0").contains("oversub:"));
    assert!(err("switch:ranks=4,bw=50GB/s,lat=1us,sharp=yes").contains("sharp:"));
    assert!(err("ring:ranks=4,bw=50GB/s,lat=1us,sharp=1").contains("unknown field `sharp`"));
}

#[test]
fn sharp_is_a_switch_capability() {
    let on = |s: &str| TopologySpec::parse(s).unwrap().sharp();
    assert!(on("switch:ranks=4,bw=50GB/s,lat=1us,sharp=1"));
    assert!(!on("switch:ranks=4,bw=50GB/s,lat=1us,sharp=0"));
    assert!(!on("switch:ranks=4,bw=50GB/s,lat=1us"));
    assert!(on("fat-tree:ranks=8,leaf=4,bw=50GB/s,lat=1us,sharp=1"));
    // sharp=0 is the default and is not printed.
    let t = TopologySpec::parse("switch:ranks=4,bw=50GB/s,lat=1us,sharp=0").unwrap();
    assert_eq!(t.to_string(), "switch:ranks=4,bw=50GB/s,lat=1us");
}
