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
        Some(s) => s.trim().to_string(),
        // Empty counts as unset, as on the ranks (which then derive a
        // secret of their own that no empty one would match).
        None => std::env::var("FERROCOLL_SECRET")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                CliError::Usage(
                    "give --secret or set FERROCOLL_SECRET to the ranks' secret (it is unset or \
                     empty)"
                        .into(),
                )
            })?,
    };
    if secret.trim().is_empty() {
        return Err(CliError::Usage(
            "--secret is empty; give the secret the ranks present (their FERROCOLL_SECRET)".into(),
        ));
    }
    let server = ferrocoll::store::StoreServer::start(&args.addr, &secret)?;
    eprintln!("ferrocoll store: serving on {}", server.local_addr());
    loop {
        std::thread::park();
    }
}
