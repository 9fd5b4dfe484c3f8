//! `ferrocoll bench moe`: times the MoE exchange of `ferrocoll::moe`
//! (dispatch, with its count exchange, and combine) on a router's
//! workload, and with `--check` verifies it against the naive reference.
//!
//! Every rank has `--tokens` tokens of `--hidden` elements; the router's
//! top-k is generated from `--seed` (k distinct experts per token drawn from
//! `--skew`, weights the softmax of random logits: the reference's
//! `Routing::Sampled`, so every rank can rebuild every other rank's
//! routing). For each combination of the comma-separated `--tokens` and
//! `--skew` values, every rank runs `--warmup` untimed layers of each
//! `--schedule`, then `--iters` rounds of one timed layer of each schedule,
//! interleaved (each round starting one schedule later, so that a change
//! of the machine's load, or a shaped link's state, falls on all alike): a
//! barrier, dispatch (timed), a barrier, combine of the received rows as
//! the experts' outputs (timed). Reported per line and schedule: the
//! slowest rank's mean (and median) of each.
//!
//! **logical bandwidth**, as DeepEP's tests count it: the bytes of the
//! rows a rank receives in dispatch (from every rank, itself included; the
//! bytes it sends back in combine), divided by the time. DeepEP sends a
//! token once per destination rank, this exchange once per (token, expert)
//! choice, so at equal top-k these bytes are up to k times DeepEP's.
//! `logical_bytes` is the mean over ranks, `dispatch_GBps` and
//! `combine_GBps` divide it by each phase's time and `logical_GBps` is
//! 2·logical_bytes / (dispatch + combine).

use std::io::{self, Write};
use std::time::Instant;

use clap::Args;
use ferrocoll::moe::model::{self, Skew};
use ferrocoll::moe::reference::{check_with, Case, Routing, TestElem};
use ferrocoll::moe::{Dispatcher, Handle, Schedule};
use ferrocoll::{bf16, f16, Communicator, DType, ReduceOp};
use serde::Serialize;

use crate::bench::{self, Transport};
use crate::error::CliError;

/// Arguments of `ferrocoll bench moe`.
#[derive(Debug, Args)]
pub struct MoeArgs {
    /// Tokens per rank; a comma-separated list sweeps them.
    #[arg(long, default_value = "4096", value_delimiter = ',')]
    tokens: Vec<usize>,
    /// Elements per token row.
    #[arg(long, default_value_t = 2048)]
    hidden: usize,
    /// Choices per token (distinct experts when there are enough).
    #[arg(long, default_value_t = 2)]
    topk: usize,
    /// Experts in all (a multiple of the ranks).
    #[arg(long, default_value_t = 16)]
    experts: usize,
    /// Capacity factor C (decimal, e.g. 1.25: each expert keeps
    /// ceil(P·T·k/E · C) rows) or `dropless`.
    #[arg(long, default_value = "dropless", value_parser = parse_capacity)]
    capacity: Capacity,
    /// Routing: uniform, or zipf:S (expert e with probability ∝ (e+1)^-S);
    /// a comma-separated list sweeps them.
    #[arg(long, default_value = "uniform", value_delimiter = ',')]
    skew: Vec<Skew>,
    /// Schedule of the rows: auto, flat, direct, pairwise or two-level; a
    /// comma-separated list sweeps them.
    #[arg(long, default_value = "auto", value_delimiter = ',')]
    schedule: Vec<Schedule>,
    /// Element type of the rows: bf16, f16 or f32.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    dtype: DType,
    /// Seed of the routing.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Timed layers (dispatch + combine) per line.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Untimed layers before timing.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// After timing, one more layer on the reference's data, every expert
    /// e(v) = v·(e+1) + e, counting the elements of the experts' inputs and
    /// of the output that differ from the naive reference (`wrong`).
    #[arg(long)]
    check: bool,
    /// Print one JSON object per line of results, nothing else, on stdout.
    #[arg(long)]
    json: bool,
    /// Hand the experts' inputs and the output back to the dispatcher after
    /// each layer (`Dispatcher::recycle`), as a training loop would; with
    /// `--no-recycle` every layer allocates them afresh.
    #[arg(long = "no-recycle", action = clap::ArgAction::SetFalse)]
    recycle: bool,
    /// Number of ranks (default: 4; under a launcher, the job's ranks).
    #[arg(short = 'n', long)]
    ranks: Option<usize>,
    /// How ranks communicate, as for `bench COLL`: thread, shm, tcp or auto
    /// (default thread; auto under a launcher).
    #[arg(long, value_parser = bench::parse_transport)]
    transport: Option<Transport>,
}

/// A capacity factor as a ratio (exact in the reference's integer
/// arithmetic) or dropless.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Capacity(Option<(usize, usize)>);

fn parse_capacity(s: &str) -> Result<Capacity, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("dropless") {
        return Ok(Capacity(None));
    }
    let bad = || {
        format!("`{s}` is not a capacity factor; use a decimal number > 0 (1.0, 1.25) or dropless")
    };
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() && frac.is_empty()
        || !whole
            .chars()
            .chain(frac.chars())
            .all(|c| c.is_ascii_digit())
        || frac.len() > 6
    {
        return Err(bad());
    }
    let den = 10usize.pow(frac.len() as u32);
    let num: usize = format!("{whole}{frac}").parse().map_err(|_| bad())?;
    if num == 0 {
        return Err(bad());
    }
    Ok(Capacity(Some((num, den))))
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    match s.parse::<DType>() {
        Ok(d @ (DType::BF16 | DType::F16 | DType::F32)) => Ok(d),
        Ok(d) => Err(format!(
            "bench moe measures bf16, f16 and f32 rows, not {}",
            d.name()
        )),
        Err(e) => Err(crate::error::lib_message(e)),
    }
}

/// One line of results: the `--json` object, field for field.
#[derive(Debug, Serialize)]
struct Line {
    bench: &'static str,
    ranks: usize,
    transport: &'static str,
    topology: String,
    tokens: usize,
    hidden: usize,
    dtype: &'static str,
    topk: usize,
    experts: usize,
    /// The capacity factor, or null for dropless.
    capacity: Option<f64>,
    skew: String,
    seed: u64,
    iters: u64,
    /// Whether the outputs were handed back after each layer.
    recycle: bool,
    /// The schedule asked for.
    requested: &'static str,
    /// The schedule dispatch ran (auto's choice).
    schedule: &'static str,
    /// The schedule combine ran.
    combine_schedule: &'static str,
    /// Whether dispatch and combine ran one flat exchange per local expert
    /// (no regrouping copy).
    by_expert: [bool; 2],
    /// Slowest rank's mean time of dispatch (count exchange included), us.
    dispatch_us: f64,
    /// Slowest rank's mean time of combine, us.
    combine_us: f64,
    /// Slowest rank's median time of dispatch, us.
    dispatch_median_us: f64,
    /// Slowest rank's median time of combine, us.
    combine_median_us: f64,
    /// Median over the timed layers of the slowest rank's time of that
    /// layer's dispatch, us: what a synchronous layer waits for, and the
    /// statistic `auto`'s measuring takes (the slowest rank per call).
    dispatch_layer_median_us: f64,
    /// The same for combine.
    combine_layer_median_us: f64,
    /// Mean over ranks of the bytes of the rows a rank receives.
    logical_bytes: f64,
    #[serde(rename = "logical_GBps")]
    logical_gbps: f64,
    #[serde(rename = "dispatch_GBps")]
    dispatch_gbps: f64,
    #[serde(rename = "combine_GBps")]
    combine_gbps: f64,
    /// (token, choice) pairs dropped, all ranks together.
    dropped: usize,
    /// Wrong elements under `--check`, all ranks together (null without).
    wrong: Option<u64>,
    /// The cost model's dispatch time per candidate schedule, us.
    predicted_dispatch_us: std::collections::BTreeMap<&'static str, f64>,
    /// The same for combine.
    predicted_combine_us: std::collections::BTreeMap<&'static str, f64>,
}

/// What every rank runs, validated.
struct Setup<'a> {
    args: &'a MoeArgs,
    n: usize,
    transport: Transport,
}

/// Runs `ferrocoll bench moe`.
pub fn moe_main(args: &MoeArgs) -> Result<(), CliError> {
    let (n, transport) = bench::ranks_and_transport(args.ranks, args.transport, 4);
    if n == 0 || args.experts == 0 || args.experts % n != 0 {
        return Err(CliError::Usage(format!(
            "--experts {} cannot be split evenly over {n} ranks; use a positive multiple of {n}",
            args.experts
        )));
    }
    if args.hidden == 0 || args.topk == 0 {
        return Err(CliError::Usage(
            "--hidden and --topk must be at least 1".into(),
        ));
    }
    // A bad FERROCOLL_* variable before anything starts.
    ferrocoll::Config::from_env()?;
    Schedule::from_env()?;
    if transport != Transport::Thread && !crate::run::in_job() {
        return crate::run::relaunch_self(n, transport.name(), "MoE benchmark");
    }
    let setup = Setup { args, n, transport };
    let outcomes = if transport == Transport::Thread {
        ferrocoll::local::run(n, |comm| {
            let r = run_rank(&comm, &setup);
            if r.is_err() {
                comm.abort();
            }
            r
        })?
    } else {
        let comm = ferrocoll::init()?;
        if comm.size() != n {
            return Err(CliError::Usage(format!(
                "bench moe -n {n} but the job has {} ranks; pass -n {}",
                comm.size(),
                comm.size()
            )));
        }
        let r = run_rank(&comm, &setup);
        if r.is_err() {
            comm.abort();
        }
        vec![r]
    };
    let mut secondary = None;
    let mut wrong = 0;
    for outcome in outcomes {
        match outcome {
            Ok(w) => wrong += w,
            Err(e) if e.is_secondary() => {
                secondary.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(e) = secondary {
        return Err(e);
    }
    if wrong > 0 {
        return Err(CliError::Run(format!(
            "--check found {wrong} wrong elements in the MoE exchange"
        )));
    }
    Ok(())
}

fn print_header(args: &MoeArgs, n: usize, transport: Transport) -> Result<(), CliError> {
    if !args.json {
        writeln!(
            io::stdout(),
            "# bench moe: {} ranks ({}), hidden {} {}, top-{} of {} experts, capacity {}, seed {}; \
             times are the slowest rank's mean (median) over {} layers",
            n,
            transport.name(),
            args.hidden,
            args.dtype.name(),
            args.topk,
            args.experts,
            capacity_name(args.capacity),
            args.seed,
            args.iters
        )?;
        writeln!(
            io::stdout(),
            "# {:>6} {:>9} {:>9} {:>10} {:>10} {:>18} {:>18} {:>9} {:>8} {:>6}",
            "tokens",
            "skew",
            "asked",
            "dispatch",
            "combine",
            "dispatch_us",
            "combine_us",
            "GB/s",
            "dropped",
            "wrong"
        )?;
    }
    Ok(())
}

fn capacity_name(c: Capacity) -> String {
    match c.0 {
        None => "dropless".into(),
        Some((num, den)) => format!("{}", num as f64 / den as f64),
    }
}

/// One rank's lines; returns the wrong elements rank 0 reported (0
/// elsewhere).
fn run_rank(comm: &Communicator, setup: &Setup<'_>) -> Result<u64, CliError> {
    match setup.args.dtype {
        DType::F32 => run_as::<f32>(comm, setup),
        DType::F16 => run_as::<f16>(comm, setup),
        _ => run_as::<bf16>(comm, setup),
    }
}

fn run_as<T: TestElem>(comm: &Communicator, setup: &Setup<'_>) -> Result<u64, CliError> {
    let a = setup.args;
    let (n, me) = (setup.n, comm.rank());
    if me == 0 {
        print_header(a, n, setup.transport)?;
    }
    let mut wrong_total = 0;
    for &tokens in &a.tokens {
        for &skew in &a.skew {
            let case = Case {
                ranks: n,
                experts: a.experts,
                hidden: a.hidden,
                topk: a.topk,
                capacity: a.capacity.0,
                tokens: vec![tokens; n],
                routing: Routing::Sampled { skew, seed: a.seed },
            };
            let x: Vec<T> = case.x(me);
            let (idx, w) = case.route(me);
            let input = (x.as_slice(), idx.as_slice(), w.as_slice());
            // The schedules' layers interleave, so that a change of the
            // machine's load falls on all of them alike.
            let mut runs = a
                .schedule
                .iter()
                .map(|&s| {
                    let moe = Dispatcher::new(comm, case.spec().with_schedule(s))?;
                    Ok((s, moe, Timed::default()))
                })
                .collect::<Result<Vec<_>, CliError>>()?;
            // Each round starts one schedule later, so that none always
            // follows the same one (on a shaped link the previous layer's
            // burst decides how full the token bucket is). The warm-up
            // rounds run like the timed ones, barriers included: `auto`
            // measures its candidates on its first calls, warm-up or not.
            let k = runs.len();
            for i in 0..a.warmup + a.iters as usize {
                for q in 0..k {
                    let (_, moe, timed) = &mut runs[(i + q) % k];
                    timed.layer(comm, moe, input, a.recycle, i >= a.warmup)?;
                }
            }
            for (requested, moe, timed) in runs {
                let line = finish::<T>(comm, setup, &case, &moe, requested, timed)?;
                wrong_total += line.wrong.unwrap_or(0);
                if me == 0 {
                    print_line(&line, a.json)?;
                }
            }
        }
    }
    Ok(if me == 0 { wrong_total } else { 0 })
}

/// One schedule's timed layers.
#[derive(Default)]
struct Timed {
    dispatch: Vec<f64>,
    combine: Vec<f64>,
    handle: Option<Handle>,
}

impl Timed {
    /// One layer: dispatch then combine of the received rows, each after a
    /// barrier, timed (kept) when `timed`.
    fn layer<T: TestElem>(
        &mut self,
        comm: &Communicator,
        moe: &Dispatcher,
        (x, idx, w): (&[T], &[u32], &[f32]),
        recycle: bool,
        timed: bool,
    ) -> Result<(), CliError> {
        comm.barrier()?;
        let t = Instant::now();
        let (inputs, h) = moe.dispatch(x, idx, w)?;
        let dispatch = t.elapsed().as_secs_f64();
        comm.barrier()?;
        let t = Instant::now();
        let y = moe.combine(inputs.as_slice(), &h)?;
        let combine = t.elapsed().as_secs_f64();
        if timed {
            self.dispatch.push(dispatch);
            self.combine.push(combine);
        }
        if recycle {
            moe.recycle(inputs.into_vec());
            moe.recycle(y);
        }
        self.handle = Some(h);
        Ok(())
    }
}

/// The line of one schedule: its times (the slowest rank's), the optional
/// check, and the model's predictions for the count matrix.
fn finish<T: TestElem>(
    comm: &Communicator,
    setup: &Setup<'_>,
    case: &Case,
    moe: &Dispatcher,
    requested: Schedule,
    timed: Timed,
) -> Result<Line, CliError> {
    let a = setup.args;
    let Timed {
        mut dispatch,
        mut combine,
        handle,
    } = timed;
    let handle = handle.expect("at least one timed layer");
    // Per layer, the slowest rank's time (before the sorting below).
    let per_layer = |v: &[f64]| -> Result<f64, CliError> {
        let mut slowest = vec![0.0f64; v.len()];
        comm.all_reduce(v, &mut slowest, ReduceOp::Max)?;
        slowest.sort_by(f64::total_cmp);
        Ok(slowest[slowest.len() / 2])
    };
    let layer_medians = [per_layer(&dispatch)?, per_layer(&combine)?];
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v.iter().sum::<f64>() / v.len() as f64, v[v.len() / 2])
    };
    let (dm, dmed) = stats(&mut dispatch);
    let (cm, cmed) = stats(&mut combine);
    let row_bytes = (a.hidden * a.dtype.size()) as f64;
    let mine = [dm, dmed, cm, cmed];
    let mut slowest = [0.0f64; 4];
    comm.all_reduce(&mine, &mut slowest, ReduceOp::Max)?;
    let mut received = [0u64];
    comm.all_reduce(
        &[handle.rows_received() as u64],
        &mut received,
        ReduceOp::Sum,
    )?;
    let logical_bytes = received[0] as f64 / setup.n as f64 * row_bytes;

    let wrong = if a.check {
        let checked = check_with::<T>(moe, comm.rank(), case).map_err(CliError::Run)?;
        if let Some(first) = &checked.first {
            eprintln!("bench moe --check, rank {}: {first}", comm.rank());
        }
        let mut total = [0u64];
        comm.all_reduce(&[checked.wrong as u64], &mut total, ReduceOp::Sum)?;
        Some(total[0])
    } else {
        None
    };

    // What the model predicted for this count matrix, per candidate.
    let rows = handle.rank_rows();
    let matrix = |transpose: bool| -> Vec<Vec<f64>> {
        (0..setup.n)
            .map(|s| {
                (0..setup.n)
                    .map(|d| {
                        let (i, j) = if transpose { (d, s) } else { (s, d) };
                        rows[i * setup.n + j] as f64
                    })
                    .collect()
            })
            .collect()
    };
    let profile = comm.profile();
    let predicted = |transpose: bool| {
        model::price(&matrix(transpose), row_bytes, comm.topology(), &profile)
            .into_iter()
            .map(|c| (c.schedule.name(), c.cost.total() * 1e6))
            .collect()
    };
    let skew = match case.routing {
        Routing::Sampled { skew, .. } => skew.to_string(),
        _ => String::new(),
    };
    Ok(Line {
        bench: "moe",
        ranks: setup.n,
        transport: comm.transport_name(),
        topology: comm.topology().to_string(),
        tokens: case.tokens[0],
        hidden: a.hidden,
        dtype: a.dtype.name(),
        topk: a.topk,
        experts: a.experts,
        capacity: a.capacity.0.map(|(num, den)| num as f64 / den as f64),
        skew,
        seed: a.seed,
        iters: a.iters,
        recycle: a.recycle,
        requested: requested.name(),
        schedule: handle.dispatch_schedule().name(),
        combine_schedule: handle.combine_schedule().name(),
        by_expert: handle.runs_by_expert(),
        dispatch_us: slowest[0] * 1e6,
        combine_us: slowest[2] * 1e6,
        dispatch_median_us: slowest[1] * 1e6,
        combine_median_us: slowest[3] * 1e6,
        dispatch_layer_median_us: layer_medians[0] * 1e6,
        combine_layer_median_us: layer_medians[1] * 1e6,
        logical_bytes,
        logical_gbps: 2.0 * logical_bytes / (slowest[0] + slowest[2]) / 1e9,
        dispatch_gbps: logical_bytes / slowest[0] / 1e9,
        combine_gbps: logical_bytes / slowest[2] / 1e9,
        dropped: handle.dropped_everywhere(),
        wrong,
        predicted_dispatch_us: predicted(false),
        predicted_combine_us: predicted(true),
    })
}

fn print_line(line: &Line, json: bool) -> Result<(), CliError> {
    let text = if json {
        serde_json::to_string(line).map_err(|e| CliError::Run(format!("encoding JSON: {e}")))?
    } else {
        format!(
            "  {:>6} {:>9} {:>9} {:>10} {:>10} {:>9.1} ({:>6.1}) {:>9.1} ({:>6.1}) {:>9.3} {:>8} {:>6}",
            line.tokens,
            line.skew,
            line.requested,
            line.schedule,
            line.combine_schedule,
            line.dispatch_us,
            line.dispatch_median_us,
            line.combine_us,
            line.combine_median_us,
            line.logical_gbps,
            line.dropped,
            line.wrong.map_or_else(|| "N/A".to_string(), |w| w.to_string())
        )
    };
    let mut out = io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_are_exact_ratios() {
        assert_eq!(parse_capacity("dropless"), Ok(Capacity(None)));
        assert_eq!(parse_capacity("1.25"), Ok(Capacity(Some((125, 100)))));
        assert_eq!(parse_capacity("2"), Ok(Capacity(Some((2, 1)))));
        assert_eq!(parse_capacity(".5"), Ok(Capacity(Some((5, 10)))));
        for bad in ["0", "0.0", "-1", "1e3", "lots", ".", "1.2.3"] {
            assert!(parse_capacity(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_float_rows() {
        assert_eq!(parse_dtype("bf16"), Ok(DType::BF16));
        assert!(parse_dtype("i32")
            .unwrap_err()
            .contains("bf16, f16 and f32"));
    }
}
