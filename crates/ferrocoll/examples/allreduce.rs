//! A multi-process allreduce: every rank contributes `rank + 1` and checks
//! that it gets `1 + 2 + ... + size`.
//!
//! It reads its place in the job from the environment, so it runs unchanged
//! under any launcher:
//!
//! ```text
//! cargo build --release --example allreduce
//! ferrocoll run -n 4 target/release/examples/allreduce
//! mpirun -np 4 -x FERROCOLL_ADDR=127.0.0.1:29500 target/release/examples/allreduce
//! for r in 0 1 2 3; do RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 \
//!     MASTER_PORT=29500 target/release/examples/allreduce & done; wait
//! ```

use ferrocoll::ReduceOp;

fn main() -> Result<(), ferrocoll::Error> {
    let comm = ferrocoll::init()?;
    let (rank, size) = (comm.rank(), comm.size());
    let count = 1 << 20;
    let mut values = vec![(rank + 1) as f32; count];
    comm.all_reduce_in_place(&mut values, ReduceOp::Sum)?;
    let want = (size * (size + 1) / 2) as f32;
    let wrong = values.iter().filter(|v| **v != want).count();
    if rank == 0 {
        let placement = comm.placement().expect("init places the ranks");
        println!(
            "allreduce of {count} f32 over {size} ranks ({} node(s), transport {}, launcher {:?}): \
             every element is {} (expected {want}), {wrong} wrong",
            placement.nodes(),
            comm.transport_name(),
            placement.launcher,
            values[0],
        );
    }
    comm.barrier()?;
    if wrong > 0 {
        std::process::exit(1);
    }
    Ok(())
}
