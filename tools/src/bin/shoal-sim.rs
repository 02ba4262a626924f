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

use shoal_replication::simulator::{Coverage, FaultProfile, Mode, Outcome, SimOptions, run};

const USAGE: &str = "\
usage: shoal-sim --seed N [knobs]
       shoal-sim --seeds COUNT [--from START] [--jobs N] [knobs]

Runs Shoal's deterministic cluster simulator: nodes running the real node layer and storage
engine over simulated disks, clients, and a faulty network, all decided by one u64 seed.

knobs:
  --replicas N              replicas per group (1, 3 or 5; default 3)
  --groups N                groups, each replicated on every node (default 2)
  --clients N               clients per group (default 2)
  --ticks N                 ticks of the fault phase (default 20000)
  --liveness-ticks N        ticks the cluster may take to finish after faults stop (default 10000)
  --retention-bytes N       every group's retention by size (default 0: none)
  --value-bytes N           bytes each client message's value is padded to (at most 4000)
  --mode M                  persisted | replicated | mixed (default: drawn per seed)
  --faults F                swarm (drawn per seed, default) | none
  --loss-per-million N      override the drawn message loss rate
  --crash-per-million N     override the drawn crash rate (per node per tick)
  --partition-per-million N override the drawn partition rate (per tick)
  --pause-per-million N     override the drawn pause rate (per node per tick)
  --trace GROUP             print every replica message of GROUP to stderr as delivered
";

struct Args {
    seed: Option<u64>,
    seeds: Option<u64>,
    from: u64,
    jobs: u64,
    options: SimOptions,
    swarm: bool,
    loss: Option<u32>,
    crash: Option<u32>,
    partition: Option<u32>,
    pause: Option<u32>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seed: None,
        seeds: None,
        from: 0,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        options: SimOptions::new(0),
        swarm: true,
        loss: None,
        crash: None,
        partition: None,
        pause: None,
    };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        if flag == "--help" || flag == "-h" {
            return Err(String::new());
        }
        let value = words.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|_| format!("{flag}: not a number: {value}"));
        let rate = || {
            value
                .parse::<u32>()
                .ok()
                .filter(|v| *v <= 1_000_000)
                .ok_or_else(|| format!("{flag}: not a rate in 0..=1000000: {value}"))
        };
        match flag.as_str() {
            "--seed" => args.seed = Some(number()?),
            "--seeds" => args.seeds = Some(number()?),
            "--from" => args.from = number()?,
            "--jobs" => args.jobs = number()?.max(1),
            "--replicas" => {
                let replicas = number()?;
                if !(1..=5).contains(&replicas) {
                    return Err(format!("--replicas {replicas}: use 1 to 5"));
                }
                args.options.replicas = replicas as u8;
            }
            "--groups" => args.options.groups = number()?.clamp(1, 64),
            "--clients" => args.options.clients_per_group = number()?.clamp(1, 64),
            "--ticks" => args.options.ticks = number()?,
            "--liveness-ticks" => args.options.liveness_ticks = number()?,
            "--retention-bytes" => args.options.retention_bytes = number()?,
            "--value-bytes" => args.options.value_size_bytes = number()?.min(4_000) as usize,
            "--mode" => {
                args.options.mode = Some(match value.as_str() {
                    "persisted" => Mode::Persisted,
                    "replicated" => Mode::Replicated,
                    "mixed" => Mode::Mixed,
                    other => {
                        return Err(format!("--mode {other}: use persisted, replicated or mixed"));
                    }
                });
            }
            "--faults" => match value.as_str() {
                "swarm" => args.swarm = true,
                "none" => args.swarm = false,
                other => return Err(format!("--faults {other}: use swarm or none")),
            },
            "--loss-per-million" => args.loss = Some(rate()?),
            "--crash-per-million" => args.crash = Some(rate()?),
            "--partition-per-million" => args.partition = Some(rate()?),
            "--pause-per-million" => args.pause = Some(rate()?),
            "--trace" => args.options.trace_group = Some(number()?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.seed.is_some() == args.seeds.is_some() {
        return Err("give exactly one of --seed and --seeds".into());
    }
    Ok(args)
}

/// The options of one seed: the swarm profile the seed draws, with the knobs laid over it.
fn options_for(args: &Args, seed: u64) -> SimOptions {
    let mut options = SimOptions { seed, ..args.options };
    if !args.swarm {
        options.faults = Some(FaultProfile::none());
    } else if args.loss.is_some()
        || args.crash.is_some()
        || args.partition.is_some()
        || args.pause.is_some()
    {
        let mut profile = SimOptions::new(seed).drawn_faults();
        if let Some(loss) = args.loss {
            profile.network.loss_per_million = loss;
        }
        profile.crash_per_million = args.crash.unwrap_or(profile.crash_per_million);
        profile.partition_per_million = args.partition.unwrap_or(profile.partition_per_million);
        profile.pause_per_million = args.pause.unwrap_or(profile.pause_per_million);
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
    let args = match parse() {
        Ok(args) => args,
        Err(error) => {
            if !error.is_empty() {
                eprintln!("shoal-sim: {error}\n");
            }
            eprint!("{USAGE}");
            return if error.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(2) };
        }
    };
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
        for _ in 0..args.jobs.min(count.max(1)) {
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
