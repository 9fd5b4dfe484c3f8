//! `ferrocoll store`: a job's rendezvous store as a process of its own, for
//! jobs whose rank 0 should not serve it (FERROCOLL_STORE=external on the
//! ranks).

use clap::Args;

use crate::error::CliError;

/// Options of `ferrocoll store`.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Address to listen on, `host:port` (the ranks' FERROCOLL_ADDR).
    #[arg(long)]
    pub addr: String,
    /// The job secret; default: the FERROCOLL_SECRET environment variable.
    #[arg(long)]
    pub secret: Option<String>,
}

/// Serves until the process is stopped.
pub fn main(args: &StoreArgs) -> Result<(), CliError> {
    let secret = match &args.secret {
        Some(s) => s.clone(),
        None => std::env::var("FERROCOLL_SECRET").map_err(|_| {
            CliError::Usage(
                "give --secret or set FERROCOLL_SECRET (the ranks present the same)".into(),
            )
        })?,
    };
    let server = ferrocoll::store::StoreServer::start(&args.addr, &secret)?;
    eprintln!("ferrocoll store: serving on {}", server.local_addr());
    loop {
        std::thread::park();
    }
}
