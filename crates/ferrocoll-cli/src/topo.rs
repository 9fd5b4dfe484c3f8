//! `ferrocoll topo`: what a multi-process run sees — hosts, nodes, the
//! topology handed to the algorithms, and how ranks reach each other.

use std::io::Write;

use clap::Args;

use crate::error::CliError;

/// Options of `ferrocoll topo`.
#[derive(Debug, Args)]
pub struct TopoArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `ferrocoll topo`.
pub fn main(args: &TopoArgs) -> Result<(), CliError> {
    if ferrocoll::world::WorldSpec::from_env().is_err() {
        // Not one rank of a job: say what this host is and how to see more.
        let id = ferrocoll::init::host_identity();
        if args.json {
            println!("{}", serde_json::json!({ "ranks": 1, "host": id }));
        } else {
            println!("# ferrocoll topo: not started by a launcher; this host is {id}");
            println!(
                "# run `ferrocoll run -n N ferrocoll topo` (or under torchrun, mpirun, srun) to see a job"
            );
        }
        return Ok(());
    }
    let comm = ferrocoll::init()?;
    let placement = comm
        .placement()
        .ok_or_else(|| CliError::Run("init() returned a communicator without placement".into()))?
        .clone();
    // Every rank reports its links to rank 0 (a rank's view of shm/tcp is
    // its own), as one byte per peer: 0 self, 1 shm, 2 tcp.
    let n = comm.size();
    let code = |l: &str| match l {
        "self" => 0u8,
        "shm" => 1,
        _ => 2,
    };
    let mine: Vec<u8> = placement.links.iter().map(|l| code(l)).collect();
    let mut all = vec![0u8; n * n];
    comm.gather(&mine, &mut all, 0)?;
    if comm.rank() != 0 {
        return Ok(());
    }
    let topo = comm
        .topology()
        .levels()
        .iter()
        .map(|l| l.to_string())
        .collect::<Vec<_>>()
        .join("x");
    let name = |c: u8| ["self", "shm", "tcp"][c as usize];
    let mut out = std::io::stdout().lock();
    if args.json {
        let links: Vec<Vec<&str>> = all
            .chunks(n)
            .map(|row| row.iter().map(|c| name(*c)).collect())
            .collect();
        let json = serde_json::json!({
            "ranks": n,
            "nodes": placement.nodes(),
            "launcher": placement.launcher.name(),
            "store": placement.store_addr,
            "topology": topo,
            "transport": comm.transport_name(),
            "hosts": placement.hosts,
            "node_of": placement.node_of,
            "links": links,
        });
        writeln!(out, "{json}")?;
        return Ok(());
    }
    writeln!(
        out,
        "# ferrocoll topo: {n} ranks on {} node(s), launcher {}, rendezvous {}",
        placement.nodes(),
        placement.launcher.name(),
        placement.store_addr
    )?;
    writeln!(out, "# topology given to the algorithms: {topo} (FERROCOLL_TOPO or FERROCOLL_TOPO_FILE override it)")?;
    for node in 0..placement.nodes() {
        let ranks: Vec<String> = (0..n)
            .filter(|&r| placement.node_of[r] == node)
            .map(|r| r.to_string())
            .collect();
        let host = &placement.hosts[ranks[0].parse::<usize>().expect("a rank number")];
        writeln!(out, "node {node}  {host}  ranks {}", ranks.join(","))?;
    }
    writeln!(out, "# links (row: from rank, column: to rank)")?;
    for (r, row) in all.chunks(n).enumerate() {
        let cells: Vec<&str> = row.iter().map(|c| name(*c)).collect();
        writeln!(out, "rank {r:>3}: {}", cells.join(" "))?;
    }
    Ok(())
}
