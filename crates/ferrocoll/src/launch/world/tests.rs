//! The launcher tables against example environments.

use std::collections::HashMap;

use super::job_id::is_valid_job_id;
use super::slurm::first_slurm_host;
use super::*;

fn spec(vars: &[(&str, &str)]) -> Result<WorldSpec> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    WorldSpec::from_vars(&move |name| map.get(name).cloned())
}

fn ok(vars: &[(&str, &str)]) -> WorldSpec {
    match spec(vars) {
        Ok(s) => s,
        Err(e) => panic!("expected a spec from {vars:?}, got: {e}"),
    }
}

/// The error's full message (and, for `Config`, its variable).
fn err(vars: &[(&str, &str)]) -> (Option<String>, String) {
    match spec(vars) {
        Ok(s) => panic!("expected an error from {vars:?}, got {s:?}"),
        Err(e) => {
            let var = match &e {
                Error::Config { var, .. } => Some(var.clone()),
                Error::InvalidArgument(_) => None,
                other => panic!("unexpected error kind: {other:?}"),
            };
            (var, e.to_string())
        }
    }
}

const FERRO: &[(&str, &str)] = &[
    ("FERROCOLL_RANK", "2"),
    ("FERROCOLL_WORLD_SIZE", "4"),
    ("FERROCOLL_ADDR", "node01:29500"),
];

const TORCH: &[(&str, &str)] = &[
    ("RANK", "3"),
    ("WORLD_SIZE", "8"),
    ("LOCAL_RANK", "1"),
    ("LOCAL_WORLD_SIZE", "2"),
    ("MASTER_ADDR", "10.0.0.1"),
    ("MASTER_PORT", "29500"),
];

const OMPI: &[(&str, &str)] = &[
    ("OMPI_COMM_WORLD_RANK", "5"),
    ("OMPI_COMM_WORLD_SIZE", "6"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
    ("FERROCOLL_ADDR", "host0:29500"),
];

const SLURM: &[(&str, &str)] = &[
    ("SLURM_PROCID", "7"),
    ("SLURM_NTASKS", "16"),
    ("SLURM_LOCALID", "3"),
    ("SLURM_NTASKS_PER_NODE", "4"),
    ("SLURM_JOB_ID", "123456"),
    ("SLURM_STEP_ID", "0"),
    ("SLURM_JOB_NODELIST", "node[01-04]"),
];

fn with(
    base: &[(&'static str, &'static str)],
    extra: &[(&'static str, &'static str)],
) -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<_> = base
        .iter()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
        .copied()
        .collect();
    v.extend_from_slice(extra);
    v
}

#[test]
fn ferrocoll_family() {
    let s = ok(&with(
        FERRO,
        &[
            ("FERROCOLL_LOCAL_RANK", "0"),
            ("FERROCOLL_LOCAL_WORLD_SIZE", "2"),
            ("FERROCOLL_SECRET", "s3cret"),
            ("FERROCOLL_JOB_ID", "run-42"),
        ],
    ));
    assert_eq!(
        s,
        WorldSpec {
            rank: 2,
            size: 4,
            local_rank: Some(0),
            local_size: Some(2),
            store_addr: "node01:29500".into(),
            secret: "s3cret".into(),
            job_id: "run-42".into(),
            launcher: Launcher::Ferrocoll,
        }
    );
}

#[test]
fn ferrocoll_minimal_derives_secret_and_job_id() {
    let s = ok(FERRO);
    assert_eq!(
        (s.rank, s.size, s.local_rank, s.local_size),
        (2, 4, None, None)
    );
    assert_eq!(s.secret.len(), 16);
    assert!(s.secret.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(s.job_id.len(), 13);
    assert!(s.job_id.starts_with('j'));
    assert!(is_valid_job_id(&s.job_id));
}

#[test]
fn ferrocoll_requires_size_and_addr() {
    let (var, msg) = err(&[("FERROCOLL_RANK", "0"), ("FERROCOLL_ADDR", "h:1")]);
    assert_eq!(var, None);
    assert!(msg.contains("FERROCOLL_WORLD_SIZE"), "{msg}");
    let (var, msg) = err(&[("FERROCOLL_RANK", "0"), ("FERROCOLL_WORLD_SIZE", "2")]);
    assert_eq!(var, None);
    assert!(msg.contains("FERROCOLL_ADDR=host:port"), "{msg}");
}

#[test]
fn ferrocoll_bad_job_id() {
    let (var, msg) = err(&with(FERRO, &[("FERROCOLL_JOB_ID", "my job")]));
    assert_eq!(var.as_deref(), Some("FERROCOLL_JOB_ID"));
    assert!(msg.contains("32 characters"), "{msg}");
}

#[test]
fn torchrun_family() {
    let s = ok(&with(TORCH, &[("TORCHELASTIC_RUN_ID", "exp7")]));
    assert_eq!(s.launcher, Launcher::Torchrun);
    assert_eq!((s.rank, s.size), (3, 8));
    assert_eq!((s.local_rank, s.local_size), (Some(1), Some(2)));
    assert_eq!(s.store_addr, "10.0.0.1:29500");
    assert_eq!(s.job_id, "exp7");
}

#[test]
fn torchrun_by_hand_without_locals() {
    let s = ok(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "localhost"),
        ("MASTER_PORT", "12345"),
    ]);
    assert_eq!(
        (s.rank, s.size, s.local_rank, s.local_size),
        (0, 2, None, None)
    );
    assert_eq!(s.store_addr, "localhost:12345");
    assert!(s.job_id.starts_with('j'));
}

#[test]
fn torchrun_default_run_id_none_is_ignored() {
    let s = ok(&with(TORCH, &[("TORCHELASTIC_RUN_ID", "none")]));
    assert!(s.job_id.starts_with('j'), "{}", s.job_id);
}

#[test]
fn torchrun_ferrocoll_addr_overrides_master() {
    let s = ok(&with(TORCH, &[("FERROCOLL_ADDR", "10.0.0.1:29600")]));
    assert_eq!(s.store_addr, "10.0.0.1:29600");
}

#[test]
fn torchrun_ipv6_master_addr_is_bracketed() {
    let s = ok(&with(TORCH, &[("MASTER_ADDR", "fe80::1")]));
    assert_eq!(s.store_addr, "[fe80::1]:29500");
    let s = ok(&with(TORCH, &[("MASTER_ADDR", "[::1]")]));
    assert_eq!(s.store_addr, "[::1]:29500");
}

#[test]
fn torchrun_missing_master() {
    let (var, msg) = err(&[("RANK", "0"), ("WORLD_SIZE", "2")]);
    assert_eq!(var, None);
    assert!(
        msg.contains("MASTER_ADDR") && msg.contains("FERROCOLL_ADDR"),
        "{msg}"
    );
    let (_, msg) = err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]);
    assert!(msg.contains("MASTER_PORT is not"), "{msg}");
}

#[test]
fn open_mpi_family() {
    let s = ok(&with(OMPI, &[("OMPI_MCA_ess_base_jobid", "3826647041")]));
    assert_eq!(s.launcher, Launcher::OpenMpi);
    assert_eq!((s.rank, s.size), (5, 6));
    assert_eq!((s.local_rank, s.local_size), (Some(2), Some(3)));
    assert_eq!(s.store_addr, "host0:29500");
    assert_eq!(s.job_id, "3826647041");
}

#[test]
fn open_mpi_master_fallback() {
    let mut vars: Vec<_> = OMPI
        .iter()
        .filter(|(k, _)| *k != "FERROCOLL_ADDR")
        .copied()
        .collect();
    vars.push(("MASTER_ADDR", "h0"));
    vars.push(("MASTER_PORT", "4000"));
    assert_eq!(ok(&vars).store_addr, "h0:4000");
}

#[test]
fn open_mpi_missing_addr() {
    let vars: Vec<_> = OMPI
        .iter()
        .filter(|(k, _)| *k != "FERROCOLL_ADDR")
        .copied()
        .collect();
    let (var, msg) = err(&vars);
    assert_eq!(var, None);
    assert!(msg.contains("FERROCOLL_ADDR=host:port"), "{msg}");
    assert!(msg.contains("mpirun -x FERROCOLL_ADDR="), "{msg}");
}

#[test]
fn slurm_family() {
    let s = ok(SLURM);
    assert_eq!(s.launcher, Launcher::Slurm);
    assert_eq!((s.rank, s.size), (7, 16));
    assert_eq!((s.local_rank, s.local_size), (Some(3), Some(4)));
    // 20000 + 123456 % 20000 = 23456
    assert_eq!(s.store_addr, "node01:23456");
    assert_eq!(s.job_id, "123456_0");
}

#[test]
fn slurm_address_sources() {
    let s = ok(&with(SLURM, &[("FERROCOLL_PORT", "30000")]));
    assert_eq!(s.store_addr, "node01:30000");
    let s = ok(&with(SLURM, &[("MASTER_PORT", "31000")]));
    assert_eq!(s.store_addr, "node01:31000");
    let s = ok(&with(
        SLURM,
        &[("MASTER_ADDR", "head"), ("MASTER_PORT", "31000")],
    ));
    assert_eq!(s.store_addr, "head:31000");
    let s = ok(&with(
        SLURM,
        &[("FERROCOLL_ADDR", "x:1"), ("MASTER_ADDR", "head")],
    ));
    assert_eq!(s.store_addr, "x:1");
    let s = ok(&with(SLURM, &[("SLURM_STEP_NODELIST", "gpu[7-8]")]));
    assert_eq!(s.store_addr, "gpu7:23456");
    let mut vars: Vec<_> = SLURM
        .iter()
        .filter(|(k, _)| *k != "SLURM_JOB_NODELIST")
        .copied()
        .collect();
    vars.push(("SLURM_NODELIST", "a,b"));
    assert_eq!(ok(&vars).store_addr, "a:23456");
}

#[test]
fn slurm_missing_nodelist_and_bad_nodelist() {
    let vars: Vec<_> = SLURM
        .iter()
        .filter(|(k, _)| *k != "SLURM_JOB_NODELIST")
        .copied()
        .collect();
    let (var, msg) = err(&vars);
    assert_eq!(var, None);
    assert!(msg.contains("FERROCOLL_ADDR"), "{msg}");
    let (var, msg) = err(&with(SLURM, &[("SLURM_JOB_NODELIST", "node[01-04")]));
    assert_eq!(var.as_deref(), Some("SLURM_JOB_NODELIST"));
    assert!(msg.contains("FERROCOLL_ADDR"), "{msg}");
}

#[test]
fn slurm_tasks_per_node_forms() {
    let s = ok(&with(SLURM, &[("SLURM_NTASKS_PER_NODE", "4,2")]));
    assert_eq!(s.local_size, None);
    let s = ok(&with(SLURM, &[("SLURM_STEP_TASKS_PER_NODE", "8(x2)")]));
    assert_eq!(s.local_size, Some(8));
    // An allocation-wide count that cannot fit this step is dropped.
    let s = ok(&with(SLURM, &[("SLURM_NTASKS_PER_NODE", "32")]));
    assert_eq!(s.local_size, None);
}

#[test]
fn pmi_family() {
    let s = ok(&[
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "9"),
    ]);
    assert_eq!(s.launcher, Launcher::Pmi);
    assert_eq!(
        (s.rank, s.size, s.local_rank, s.local_size),
        (1, 2, None, None)
    );
    assert_eq!(s.store_addr, "h:9");
    let s = ok(&[
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
        ("FERROCOLL_ADDR", "h:9"),
        ("FERROCOLL_LOCAL_RANK", "1"),
        ("FERROCOLL_LOCAL_WORLD_SIZE", "2"),
    ]);
    assert_eq!((s.local_rank, s.local_size), (Some(1), Some(2)));
}

#[test]
fn pmi_missing_addr() {
    let (var, msg) = err(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]);
    assert_eq!(var, None);
    assert!(msg.contains("FERROCOLL_ADDR=host:port"), "{msg}");
}

#[test]
fn precedence() {
    let both: Vec<_> = FERRO.iter().chain(TORCH).copied().collect();
    let s = ok(&both);
    assert_eq!(s.launcher, Launcher::Ferrocoll);
    assert_eq!((s.rank, s.size), (2, 4));

    let torch_ompi: Vec<_> = TORCH.iter().chain(OMPI).copied().collect();
    assert_eq!(ok(&torch_ompi).launcher, Launcher::Torchrun);

    let ompi_slurm: Vec<_> = OMPI.iter().chain(SLURM).copied().collect();
    assert_eq!(ok(&ompi_slurm).launcher, Launcher::OpenMpi);

    let slurm_pmi: Vec<_> = SLURM
        .iter()
        .chain(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")])
        .copied()
        .collect();
    assert_eq!(ok(&slurm_pmi).launcher, Launcher::Slurm);
}

#[test]
fn nothing_set() {
    let (var, msg) = err(&[("HOME", "/root")]);
    assert_eq!(var, None);
    for needle in [
        "ferrocoll run -n N",
        "torchrun",
        "mpirun",
        "srun",
        "FERROCOLL_RANK",
        "FERROCOLL_ADDR",
    ] {
        assert!(msg.contains(needle), "{needle} not in {msg}");
    }
}

#[test]
fn missing_size() {
    for (rank_var, size_var) in [
        ("RANK", "WORLD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
        ("PMI_RANK", "PMI_SIZE"),
    ] {
        let (var, msg) = err(&[(rank_var, "0"), ("FERROCOLL_ADDR", "h:1")]);
        assert_eq!(var, None);
        assert!(msg.contains(size_var), "{size_var} not in {msg}");
    }
}

#[test]
fn rank_not_below_size() {
    let (var, msg) = err(&with(FERRO, &[("FERROCOLL_RANK", "4")]));
    assert_eq!(var.as_deref(), Some("FERROCOLL_RANK"));
    assert!(msg.contains("FERROCOLL_WORLD_SIZE=4"), "{msg}");
    let (var, _) = err(&with(TORCH, &[("RANK", "8")]));
    assert_eq!(var.as_deref(), Some("RANK"));
}

#[test]
fn zero_size() {
    let (var, _) = err(&with(
        FERRO,
        &[("FERROCOLL_RANK", "0"), ("FERROCOLL_WORLD_SIZE", "0")],
    ));
    assert_eq!(var.as_deref(), Some("FERROCOLL_WORLD_SIZE"));
}

#[test]
fn non_numeric_names_the_variable() {
    let (var, msg) = err(&with(TORCH, &[("WORLD_SIZE", "eight")]));
    assert_eq!(var.as_deref(), Some("WORLD_SIZE"));
    assert!(msg.contains("WORLD_SIZE") && msg.contains("eight"), "{msg}");
    let (var, _) = err(&with(SLURM, &[("SLURM_LOCALID", "-1")]));
    assert_eq!(var.as_deref(), Some("SLURM_LOCALID"));
    let (var, _) = err(&with(FERRO, &[("FERROCOLL_RANK", "x")]));
    assert_eq!(var.as_deref(), Some("FERROCOLL_RANK"));
}

#[test]
fn local_rank_not_below_local_size() {
    let (var, msg) = err(&with(TORCH, &[("LOCAL_RANK", "2")]));
    assert_eq!(var.as_deref(), Some("LOCAL_RANK"));
    assert!(msg.contains("LOCAL_WORLD_SIZE=2"), "{msg}");
    let (var, _) = err(&with(OMPI, &[("OMPI_COMM_WORLD_LOCAL_SIZE", "7")]));
    assert_eq!(var.as_deref(), Some("OMPI_COMM_WORLD_LOCAL_SIZE"));
}

#[test]
fn world_size_contradiction() {
    let (var, msg) = err(&with(TORCH, &[("FERROCOLL_WORLD_SIZE", "4")]));
    assert_eq!(var.as_deref(), Some("FERROCOLL_WORLD_SIZE"));
    assert!(
        msg.contains("WORLD_SIZE=8") && msg.contains("torchrun"),
        "{msg}"
    );
    // Agreeing is fine.
    assert_eq!(ok(&with(TORCH, &[("FERROCOLL_WORLD_SIZE", "8")])).size, 8);
}

#[test]
fn bad_addresses() {
    for bad in [
        "node01",
        "node01:",
        "node01:0",
        "node01:65536",
        "node01:http",
        ":29500",
        "::1:29500",
        "[::1]",
        "[::1:29500",
        "[]:29500",
        "[node]:29500",
        "no de:1",
    ] {
        let (var, msg) = err(&with(FERRO, &[("FERROCOLL_ADDR", bad)]));
        assert_eq!(var.as_deref(), Some("FERROCOLL_ADDR"), "{bad}");
        assert!(msg.contains("host:port"), "{msg}");
    }
    for good in ["node01:1", "node01:65535", "[::1]:29500", "10.1.2.3:80"] {
        assert_eq!(
            ok(&with(FERRO, &[("FERROCOLL_ADDR", good)])).store_addr,
            good
        );
    }
}

#[test]
fn bad_ports() {
    let (var, msg) = err(&with(TORCH, &[("MASTER_PORT", "0")]));
    assert_eq!(var.as_deref(), Some("MASTER_PORT"));
    assert!(msg.contains("1..=65535"), "{msg}");
    let (var, _) = err(&with(TORCH, &[("MASTER_PORT", "70000")]));
    assert_eq!(var.as_deref(), Some("MASTER_PORT"));
    let (var, _) = err(&with(SLURM, &[("FERROCOLL_PORT", "x")]));
    assert_eq!(var.as_deref(), Some("FERROCOLL_PORT"));
    let (var, _) = err(&with(SLURM, &[("SLURM_JOB_ID", "abc")]));
    assert_eq!(var.as_deref(), Some("SLURM_JOB_ID"));
}

#[test]
fn slurm_nodelist_parser() {
    let cases = [
        ("node01", Some("node01")),
        ("node[01-04]", Some("node01")),
        ("node[001-128]", Some("node001")),
        ("node[01-03,07],gpu[1-2]", Some("node01")),
        ("node[07,01-03]", Some("node07")),
        ("a,b", Some("a")),
        ("rack[2-3]-n[05-06]", Some("rack2-n05")),
        ("n[5]", Some("n5")),
        ("  host.example.com ", Some("host.example.com")),
        ("", None),
        (",a", None),
        ("node[01-04", None),
        ("node01]", None),
        ("node[]", None),
        ("node[a-b]", None),
        ("node[[1]]", None),
    ];
    for (list, want) in cases {
        assert_eq!(first_slurm_host(list).as_deref(), want, "{list:?}");
    }
}

#[test]
fn secret_is_deterministic() {
    let a = ok(TORCH);
    let b = ok(&with(TORCH, &[("RANK", "5"), ("LOCAL_RANK", "0")]));
    assert_eq!(a.secret, b.secret, "every rank must derive the same secret");
    assert_eq!(a.job_id, b.job_id);
    let c = ok(&with(TORCH, &[("MASTER_PORT", "29501")]));
    assert_ne!(a.secret, c.secret);
    assert_ne!(a.job_id, c.job_id);
    let d = ok(&with(TORCH, &[("WORLD_SIZE", "16")]));
    assert_ne!(a.secret, d.secret);
    let e = ok(&with(TORCH, &[("FERROCOLL_SECRET", "given")]));
    assert_eq!(e.secret, "given");
}

#[test]
fn empty_strings_are_unset() {
    // Empty FERROCOLL_RANK does not select the ferrocoll family.
    let s = ok(&with(
        TORCH,
        &[
            ("FERROCOLL_RANK", ""),
            ("FERROCOLL_ADDR", " "),
            ("FERROCOLL_SECRET", ""),
        ],
    ));
    assert_eq!(s.launcher, Launcher::Torchrun);
    assert_eq!(s.store_addr, "10.0.0.1:29500");
    assert_eq!(s.secret.len(), 16);
    // Empty optional variables are skipped, not parse errors.
    let s = ok(&with(
        TORCH,
        &[
            ("LOCAL_RANK", ""),
            ("LOCAL_WORLD_SIZE", ""),
            ("TORCHELASTIC_RUN_ID", ""),
        ],
    ));
    assert_eq!((s.local_rank, s.local_size), (None, None));
    // An empty required variable is reported as missing.
    let (var, msg) = err(&with(TORCH, &[("WORLD_SIZE", "")]));
    assert_eq!(var, None);
    assert!(msg.contains("WORLD_SIZE is not"), "{msg}");
    // Nothing but empty rank variables: nothing found.
    let (var, _) = err(&[("FERROCOLL_RANK", ""), ("RANK", ""), ("PMI_RANK", "")]);
    assert_eq!(var, None);
    // Values are trimmed.
    assert_eq!(ok(&with(FERRO, &[("FERROCOLL_RANK", " 1 ")])).rank, 1);
}

#[test]
fn launcher_job_ids_are_made_file_safe() {
    assert!(is_valid_job_id(&file_safe_job_id("prterun-host-1234@1")));
    assert_eq!(
        file_safe_job_id("prterun-host-1234@1"),
        "prterun-host-1234_1"
    );
    let long = "a".repeat(40);
    let short = file_safe_job_id(&long);
    assert_eq!(short.len(), 32);
    assert!(is_valid_job_id(&short));
    assert_ne!(short, file_safe_job_id(&"a".repeat(41)));
    let s = ok(&with(TORCH, &[("TORCHELASTIC_RUN_ID", "my.run/1")]));
    assert_eq!(s.job_id, "my_run_1");
}

#[test]
fn fnv1a_known_values() {
    // Reference values of 64-bit FNV-1a (without our separator byte).
    fn plain(bytes: &[u8]) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        h
    }
    assert_eq!(plain(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(plain(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
    assert_ne!(fnv1a(&["ab", "c"]), fnv1a(&["a", "bc"]));
}

#[test]
fn launcher_names() {
    assert_eq!(Launcher::OpenMpi.to_string(), "openmpi");
    assert_eq!(Launcher::Slurm.name(), "slurm");
}
