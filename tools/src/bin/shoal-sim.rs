//! `shoal-sim`: runs the deterministic cluster simulator from the command line.
//!
//! `shoal-sim --seed N` reproduces one seed and prints its summary (exit 1 if it violated an
//! invariant); `shoal-sim --seeds COUNT --from START` runs a swarm, printing each failing seed
//! with the invariant it broke (exit 0 only when every seed passed). Knobs override the sizes
//! and fault rates the seed would otherwise draw.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use shoal_replication::simulator::{Coverage, FaultProfile, Mode, Outcome, SimOptions, run};

/// A parsed command line; the knobs are `None` where the seed (or [`SimOptions::new`]) decides.
#[derive(Debug, Parser)]
#[command(
    max_term_width = 100,
    name = "shoal-sim",
    about = "Runs Shoal's deterministic cluster simulator: nodes running the real node layer and \
             storage engine over simulated disks, clients, and a faulty network, all decided by \
             one u64 seed.",
    override_usage = "shoal-sim --seed N [knobs]\n       \
                      shoal-sim --seeds COUNT [--from START] [--jobs N] [knobs]",
    next_help_heading = "Knobs",
    // A knob given twice counts as given last, as it always did.
    args_override_self = true
)]
struct Cli {
    /// Run this one seed and print its summary (exit 1 if it violated an invariant)
    #[arg(long, value_name = "N", help_heading = "Seeds")]
    seed: Option<u64>,
    /// Run a swarm of COUNT seeds, printing each failing one (exit 0 only if all pass)
    #[arg(long, value_name = "COUNT", help_heading = "Seeds")]
    seeds: Option<u64>,
    /// The swarm's first seed
    #[arg(long, value_name = "START", default_value_t = 0, help_heading = "Seeds")]
    from: u64,
    /// Threads running the swarm (default: the available CPUs; 0 counts as 1)
    #[arg(long, value_name = "N", help_heading = "Seeds")]
    jobs: Option<u64>,
    /// Replicas per group (1, 3 or 5; default 3)
    #[arg(long, value_name = "N", value_parser = replicas)]
    replicas: Option<u8>,
    /// Of the replicas, how many are learners in every group: they take the log but never
    /// count in a quorum or vote (default 0; at most replicas − 1)
    #[arg(long, value_name = "N", value_parser = learners)]
    learners: Option<u8>,
    /// Configuration changes each partition group's first client makes (needs a learner):
    /// promote a caught-up learner and demote a voter, drop the demoted member, add it back
    #[arg(long, value_name = "N")]
    moves: Option<u32>,
    /// Groups, each replicated on every node (default 2; clamped to 1..=64)
    #[arg(long, value_name = "N", value_parser = one_to_64)]
    groups: Option<u64>,
    /// Clients per group (default 2; clamped to 1..=64)
    #[arg(long, value_name = "N", value_parser = one_to_64)]
    clients: Option<u64>,
    /// Ticks of the fault phase (default 20000)
    #[arg(long, value_name = "N")]
    ticks: Option<u64>,
    /// Ticks the cluster may take to finish after faults stop (default 10000)
    #[arg(long, value_name = "N")]
    liveness_ticks: Option<u64>,
    /// Every group's retention by size (default 0: none)
    #[arg(long, value_name = "N")]
    retention_bytes: Option<u64>,
    /// Bytes each client message's value is padded to (at most 4000)
    #[arg(long, value_name = "N", value_parser = value_bytes)]
    value_bytes: Option<usize>,
    /// persisted | replicated | mixed (default: drawn per seed)
    #[arg(long, value_name = "M", value_parser = mode)]
    mode: Option<Mode>,
    /// swarm (drawn per seed) | none
    #[arg(
        long = "faults",
        value_name = "F",
        default_value = "swarm",
        value_parser = swarm,
        action = clap::ArgAction::Set
    )]
    swarm: bool,
    /// Override the drawn message loss rate
    #[arg(long = "loss-per-million", value_name = "N", value_parser = rate)]
    loss: Option<u32>,
    /// Override the drawn crash rate (per node per tick)
    #[arg(long = "crash-per-million", value_name = "N", value_parser = rate)]
    crash: Option<u32>,
    /// Override the drawn partition rate (per tick)
    #[arg(long = "partition-per-million", value_name = "N", value_parser = rate)]
    partition: Option<u32>,
    /// Override the drawn pause rate (per node per tick)
    #[arg(long = "pause-per-million", value_name = "N", value_parser = rate)]
    pause: Option<u32>,
    /// Print every replica message of GROUP to stderr as delivered
    #[arg(long, value_name = "GROUP")]
    trace: Option<u64>,
}

fn learners(value: &str) -> Result<u8, String> {
    match value.parse::<u8>() {
        Ok(learners @ 0..=4) => Ok(learners),
        _ => Err(format!("--learners {value}: use 0 to 4")),
    }
}

fn replicas(value: &str) -> Result<u8, String> {
    match value.parse::<u8>() {
        Ok(replicas @ 1..=5) => Ok(replicas),
        _ => Err(format!("--replicas {value}: use 1 to 5")),
    }
}

fn one_to_64(value: &str) -> Result<u64, String> {
    value.parse::<u64>().map(|n| n.clamp(1, 64)).map_err(|_| "not a number".into())
}

fn value_bytes(value: &str) -> Result<usize, String> {
    value.parse::<u64>().map(|n| n.min(4_000) as usize).map_err(|_| "not a number".into())
}

fn mode(value: &str) -> Result<Mode, String> {
    match value {
        "persisted" => Ok(Mode::Persisted),
        "replicated" => Ok(Mode::Replicated),
        "mixed" => Ok(Mode::Mixed),
        _ => Err("use persisted, replicated or mixed".into()),
    }
}

/// `--faults`: whether the seed draws a swarm fault profile.
fn swarm(value: &str) -> Result<bool, String> {
    match value {
        "swarm" => Ok(true),
        "none" => Ok(false),
        _ => Err("use swarm or none".into()),
    }
}

fn rate(value: &str) -> Result<u32, String> {
    value
        .parse::<u32>()
        .ok()
        .filter(|v| *v <= 1_000_000)
        .ok_or_else(|| "not a rate in 0..=1000000".into())
}

/// The options of one seed: the swarm profile the seed draws, with the knobs laid over it.
fn options_for(cli: &Cli, seed: u64) -> SimOptions {
    let mut options = SimOptions::new(seed);
    options.replicas = cli.replicas.unwrap_or(options.replicas);
    options.learners = cli.learners.unwrap_or(0).min(options.replicas - 1);
    options.moves = cli.moves.unwrap_or(0);
    options.groups = cli.groups.unwrap_or(options.groups);
    options.clients_per_group = cli.clients.unwrap_or(options.clients_per_group);
    options.ticks = cli.ticks.unwrap_or(options.ticks);
    options.liveness_ticks = cli.liveness_ticks.unwrap_or(options.liveness_ticks);
    options.retention_bytes = cli.retention_bytes.unwrap_or(options.retention_bytes);
    options.value_size_bytes = cli.value_bytes.unwrap_or(options.value_size_bytes);
    options.mode = cli.mode;
    options.trace_group = cli.trace;
    if !cli.swarm {
        options.faults = Some(FaultProfile::none());
    } else if cli.loss.is_some()
        || cli.crash.is_some()
        || cli.partition.is_some()
        || cli.pause.is_some()
    {
        let mut profile = SimOptions::new(seed).drawn_faults();
        if let Some(loss) = cli.loss {
            profile.network.loss_per_million = loss;
        }
        profile.crash_per_million = cli.crash.unwrap_or(profile.crash_per_million);
        profile.partition_per_million = cli.partition.unwrap_or(profile.partition_per_million);
        profile.pause_per_million = cli.pause.unwrap_or(profile.pause_per_million);
        options.faults = Some(profile);
    }
    options
}

/// Runs one seed, turning a panic inside the system under test into a violation.
fn run_seed(options: &SimOptions) -> Result<Outcome, String> {
    catch_unwind(AssertUnwindSafe(|| run(options))).map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
            .unwrap_or_else(|| "panic".to_string())
    })
}

fn print_coverage(coverage: &Coverage) {
    println!("coverage: {coverage:#?}");
}

fn main() -> ExitCode {
    let args = Cli::parse();
    if args.seed.is_some() == args.seeds.is_some() {
        Cli::command()
            .error(ErrorKind::ArgumentConflict, "give exactly one of --seed and --seeds")
            .exit();
    }
    let jobs = args.jobs.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        |jobs| jobs.max(1),
    );
    if let Some(seed) = args.seed {
        let options = options_for(&args, seed);
        return match run_seed(&options) {
            Ok(outcome) => {
                println!("seed={} mode={:?} ticks={}", outcome.seed, outcome.mode, outcome.ticks);
                println!("trace_hash={:#018x}", outcome.trace_hash);
                println!("acknowledged={}", outcome.coverage.acknowledged);
                print_coverage(&outcome.coverage);
                match outcome.violation {
                    None => {
                        println!("result=pass");
                        ExitCode::SUCCESS
                    }
                    Some(violation) => {
                        println!("result=FAIL {violation}");
                        ExitCode::FAILURE
                    }
                }
            }
            Err(panic) => {
                println!("seed={seed} result=FAIL panic: {panic}");
                ExitCode::FAILURE
            }
        };
    }
    let count = args.seeds.expect("checked");
    let next = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    let total = Mutex::new(Coverage::default());
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(count.max(1)) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= count {
                        break;
                    }
                    let seed = args.from + index;
                    let options = options_for(&args, seed);
                    let failure = match run_seed(&options) {
                        Ok(outcome) => {
                            total.lock().expect("coverage").add(&outcome.coverage);
                            outcome.violation.map(|v| format!("{v} (mode {:?})", outcome.mode))
                        }
                        Err(panic) => Some(format!("panic: {panic}")),
                    };
                    if let Some(failure) = failure {
                        println!("seed {seed}: FAIL {failure}");
                        failures.lock().expect("failures").push(seed);
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().expect("failures");
    print_coverage(&total.into_inner().expect("coverage"));
    println!(
        "seeds {}..{}: {} passed, {} failed",
        args.from,
        args.from + count,
        count - failures.len() as u64,
        failures.len()
    );
    if failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
