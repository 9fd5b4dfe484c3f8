//! [`Launcher`]: which launcher's variables a [`WorldSpec`](super::WorldSpec)
//! was read from.

use std::fmt;

/// Which launcher's variables were used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// `ferrocoll run` (or `FERROCOLL_RANK`/`FERROCOLL_WORLD_SIZE`/`FERROCOLL_ADDR` set by hand).
    Ferrocoll,
    /// torchrun / torch.distributed.launch (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...).
    Torchrun,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, ...).
    Slurm,
    /// A PMI launcher: MPICH's Hydra, Intel MPI (`PMI_RANK`, `PMI_SIZE`).
    Pmi,
    /// No launcher's variables: the caller gave rank, size and a store
    /// ([`crate::init::init_with_rendezvous`], as the torch backend does).
    Caller,
}

impl Launcher {
    /// A short lowercase name: `ferrocoll`, `torchrun`, `openmpi`, `slurm`, `pmi`, `caller`.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Ferrocoll => "ferrocoll",
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "openmpi",
            Launcher::Slurm => "slurm",
            Launcher::Pmi => "pmi",
            Launcher::Caller => "caller",
        }
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
